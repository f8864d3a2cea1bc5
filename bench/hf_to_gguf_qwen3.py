"""A Qwen3ForCausalLM Hugging Face folder (BF16 safetensors, tokenizer.json) to a BF16 GGUF, with
llama.cpp's gguf-py (on PYTHONPATH) and numpy only: the tensor names and metadata that llama.cpp's
convert_hf_to_gguf.py writes for this architecture (its Qwen3Model: GPT-2 BPE vocabulary with the
"qwen2" pre-tokenizer, 1-D tensors in F32, matrices as stored). For bench/llama_cpp_side_by_side.sh,
where convert_hf_to_gguf.py itself cannot run (it needs PyTorch >= 2.1).

    PYTHONPATH=llama.cpp/gguf-py python3 bench/hf_to_gguf_qwen3.py MODEL_DIR OUT.gguf
"""
import json
import os
import sys

import numpy as np

import gguf


def read_safetensors(path):
    """name -> (dtype, shape, numpy view of the bytes) for one .safetensors file."""
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_len))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        out[name] = (t["dtype"], t["shape"], data[begin:end])
    return out


def tensors_of(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) \
        else ["model.safetensors"]
    out = {}
    for f in files:
        out.update(read_safetensors(os.path.join(model_dir, f)))
    return out


def main(model_dir, out_path):
    config = json.load(open(os.path.join(model_dir, "config.json")))
    assert config["architectures"][0] == "Qwen3ForCausalLM", config["architectures"]
    n_layers = config["num_hidden_layers"]
    writer = gguf.GGUFWriter(out_path, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.QWEN3])

    writer.add_name(os.path.basename(os.path.normpath(model_dir)))
    writer.add_block_count(n_layers)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)

    # Vocabulary: tokenizer.json's BPE vocabulary and added tokens, padded to vocab_size.
    tokenizer = json.load(open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8"))
    vocab = dict(tokenizer["model"]["vocab"])
    added = {t["id"]: t for t in tokenizer.get("added_tokens", [])}
    for i, t in added.items():
        vocab[t["content"]] = i
    by_id = {i: tok for tok, i in vocab.items()}
    tokens, types = [], []
    for i in range(config["vocab_size"]):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        tokens.append(by_id[i])
        if i in added:
            special = added[i].get("special", False) or (by_id[i].startswith("<|") and by_id[i].endswith("|>"))
            types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    gguf.SpecialVocab(model_dir, load_merges=True).add_to_gguf(writer)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, n_layers)
    for name, (dtype, shape, raw) in tensors_of(model_dir).items():
        new_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new_name is None:
            raise SystemExit(f"{name}: no GGUF name for it")
        if dtype == "BF16":
            bits = raw.view(np.uint16).reshape(shape)
        elif dtype == "F32":
            bits = raw.view(np.float32).reshape(shape)
        else:
            raise SystemExit(f"{name}: dtype {dtype} not handled (BF16 or F32 checkpoints only)")
        if len(shape) == 1:  # norms in F32, as convert_hf_to_gguf.py stores 1-D tensors
            f32 = bits.astype(np.uint32) << 16 if dtype == "BF16" else bits
            writer.add_tensor(new_name, np.ascontiguousarray(f32).view(np.float32))
        elif dtype == "BF16":
            writer.add_tensor(new_name, np.ascontiguousarray(bits), raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            writer.add_tensor(new_name, np.ascontiguousarray(bits))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"wrote {out_path}: {len(tokens)} tokens, {os.path.getsize(out_path) / 1e6:.0f} MB")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
