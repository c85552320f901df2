"""OUT_<TYPE> = IN_<TYPE> for every input that came (all inputs are optional)."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.pairs = []
        for input_config in config["input"]:
            name = input_config["name"]
            output_name = "OUT_" + name[len("IN_") :]
            output_config = pb_utils.get_output_config_by_name(config, output_name)
            self.pairs.append((name, output_name, output_config["data_type"]))

    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for name, output_name, data_type in self.pairs:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is None:
                    continue
                data = tensor.as_numpy().astype(pb_utils.triton_string_to_numpy(data_type))
                outputs.append(pb_utils.Tensor(output_name, data))
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
