"""OUT = add_sub(pyscale(X), X).OUTPUT0 = 3 X, with two synchronous BLS calls."""

import triton_python_backend_utils as pb_utils


def call(model, inputs, output):
    request = pb_utils.InferenceRequest(
        model_name=model, inputs=inputs, requested_output_names=[output]
    )
    response = request.exec()
    if response.has_error():
        raise pb_utils.TritonModelException(response.error().message())
    return pb_utils.get_output_tensor_by_name(response, output).as_numpy()


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            scaled = call("pyscale", [pb_utils.Tensor("X", x)], "Y")
            total = call(
                "add_sub",
                [pb_utils.Tensor("INPUT0", scaled), pb_utils.Tensor("INPUT1", x)],
                "OUTPUT0",
            )
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", total)]))
        return responses
