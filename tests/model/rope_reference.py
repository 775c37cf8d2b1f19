#!/usr/bin/env python3
"""Prints the RoPE reference values used by tests/model/rope_test.cpp.

Calls transformers' own modeling_rope_utils (ROPE_INIT_FUNCTIONS and the Llama default) on small
configs (head_dim 16, so 8 inverse frequencies) and prints the float32 inverse frequencies and the
attention factor of each case. Needs torch and transformers (`pip install torch transformers`).
usage: python3 tests/model/rope_reference.py
"""
import transformers
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

CASES = [
    # name, max_position_embeddings, rope_parameters, seq_len passed to the init function
    ("default", 64, {"rope_type": "default", "rope_theta": 10000.0}, None),
    ("linear", 64, {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}, None),
    ("dynamic_at_max_pos", 64, {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0}, None),
    ("dynamic_at_256", 64, {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0}, 256),
    ("llama3_tiny", 1024, {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 64}, None),
    ("yarn", 16384, {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                     "original_max_position_embeddings": 4096}, None),
    ("yarn_untruncated", 16384, {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                 "original_max_position_embeddings": 4096, "beta_fast": 16.0,
                                 "beta_slow": 2.0, "truncate": False}, None),
    ("yarn_mscale", 16384, {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                            "original_max_position_embeddings": 4096, "mscale": 1.0,
                            "mscale_all_dim": 0.5}, None),
    ("yarn_attention_factor", 32768, {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 8.0,
                                      "original_max_position_embeddings": 4096,
                                      "attention_factor": 1.5}, None),
    ("yarn_factor_from_lengths", 8192, {"rope_type": "yarn", "rope_theta": 10000.0, "factor": None,
                                        "original_max_position_embeddings": 2048}, None),
]

print(f"# transformers {transformers.__version__}")
for name, max_pos, params, seq_len in CASES:
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16,
                      max_position_embeddings=max_pos, rope_parameters=dict(params))
    if params["rope_type"] == "default":
        inv_freq, attn = LlamaRotaryEmbedding.compute_default_rope_parameters(cfg)
    else:
        inv_freq, attn = ROPE_INIT_FUNCTIONS[params["rope_type"]](cfg, None, seq_len=seq_len)
    vals = ", ".join("%.9g" % float(v) for v in inv_freq.float().tolist())
    print(f"{name}: attention_factor {float(attn)!r}\n  {{{vals}}}")
