"""The sentence-embedding pipeline run in-process, on the files of a model repository.

The same three steps as the ``minilm_embed`` ensemble, with no server: the tokenizer of
``minilm_tokenize/1/tokenizer.json`` (same truncation and padding as that model), ONNX
Runtime on ``minilm_encoder/1/model.onnx`` and ``minilm_pool/1/model.onnx``. The build
script checks it against sentence-transformers; the benchmark measures it as the
server's baseline.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

#: as in ``minilm_tokenize/1/model.py``
MAX_TOKENS = 256
PAD_MULTIPLE = 16


class Pipeline:
    """Sentences -> unit-length FP32 ``[n, 384]`` embeddings, in this process.

    Args:
        repository: a model repository written by ``build_models.py``.
        threads: ONNX Runtime intra-op threads (0: its default, one per core).
    """

    def __init__(self, repository: Path, threads: int = 0) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(
            str(repository / "minilm_tokenize" / "1" / "tokenizer.json")
        )
        self.tokenizer.enable_truncation(max_length=MAX_TOKENS)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]", pad_to_multiple_of=PAD_MULTIPLE)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        # idle threads sleep instead of spinning (as Sluice's ONNX Runtime backend sets
        # them): spinning threads take CPU from everything else on a small machine
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers = ["CPUExecutionProvider"]
        self.encoder = ort.InferenceSession(
            str(repository / "minilm_encoder" / "1" / "model.onnx"), options, providers=providers
        )
        self.pool = ort.InferenceSession(
            str(repository / "minilm_pool" / "1" / "model.onnx"), options, providers=providers
        )

    def embed(self, sentences: list[str]) -> np.ndarray:
        """FP32 ``[len(sentences), 384]``, each row of L2 norm 1."""
        encodings = self.tokenizer.encode_batch(sentences)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        types = np.array([e.type_ids for e in encodings], dtype=np.int64)
        (hidden,) = self.encoder.run(
            None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        )
        (embedding,) = self.pool.run(None, {"TOKEN_EMBEDDINGS": hidden, "ATTENTION_MASK": mask})
        return embedding
