"""The layers' include rules (docs/architecture.md), checked over src/: each rule names the folders
whose files may not include headers from some others. Exits non-zero listing every breach.

  python3 tests/include_rules.py [SOURCE_DIR]

tests/include_rules_allow.txt lists breaches known and accepted for now ("file: header", one a
line); an entry that no longer occurs is reported too, so the list only shrinks.
"""
import os
import re
import sys

TIERS = ["kernels/scalar", "kernels/avx2", "kernels/avx512", "kernels/amx"]
LAYERS = ["base", "kernels", "model", "text", "grammar", "image", "engine", "server", "tools", "cli"]

# (folders whose files are checked, folders they may not include from, why)
RULES = [
    (["base"], ["kernels", "model", "text", "grammar", "image", "engine", "server", "tools", "cli"],
     "base is the bottom layer"),
    (["kernels"], ["model", "text", "engine", "server", "tools", "cli"],
     "kernels know nothing of models and requests"),
    (["model", "kernels", "text"], ["grammar", "engine", "server"],
     "model, kernels and text sit below grammar, engine and server"),
    (["grammar"], ["model", "kernels", "engine", "server"],
     "grammar (constrained decoding) knows text and base only, and sits below engine"),
    (["text"], ["model", "kernels"], "text knows nothing of tensors"),
    (["image"], ["kernels", "model", "text", "grammar", "engine", "server"],
     "image (decoding and preprocessing) knows base only"),
    (["server"], ["model", "kernels"], "server knows nothing of kernels and tensors"),
    (["engine"], ["server", "cli"], "engine knows nothing of HTTP"),
    (["base", "kernels", "model", "text", "grammar", "image", "engine", "server"], ["tools", "cli"],
     "benchmark and test helpers (tools/) and the commands (cli/) are not part of the layers"),
    (["model/load"], ["model/arch", "model/blocks", "model/memory", "model/decoder.h",
                      "model/registry.h"], "loading a checkpoint knows nothing of the forward pass"),
    (["model/memory"], ["model/arch", "model/blocks", "model/load", "model/decoder.h",
                        "model/registry.h"], "a slot's sequence memory knows nothing of the layers"),
    (["model/blocks"], ["model/arch", "model/decoder.h", "model/registry.h"],
     "the blocks sit below the architectures that compose them"),
    (["model/vision"], ["model/arch", "model/blocks", "model/memory", "model/decoder.h",
                        "model/registry.h"],
     "the vision tower sits below the architectures that own it, beside the blocks"),
    (["model/load", "model/memory", "model/blocks"], ["model/vision"],
     "loading, memory and the decoder's blocks know nothing of the vision tower"),
    (["model/decoder.h", "model/decoder.cc", "model/config.h", "model/config.cc",
      "model/config_fields.h", "model/model.h", "model/profile.h"], ["model/arch"],
     "only the registry knows the architectures"),
] + [([tier], [t for t in TIERS if t != tier], "a kernel tier includes no other tier")
     for tier in TIERS]

ARCH = "model/arch/"


def other_architecture(file, header):
    """An architecture's file including another architecture's header."""
    if not (file.startswith(ARCH) and header.startswith(ARCH)):
        return False
    stem = lambda path: os.path.splitext(path[len(ARCH):])[0]
    return stem(file) != stem(header)

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def under(path, folder):
    return path == folder or path.startswith(folder + "/")


def breaches(includes):
    """includes: [(file relative to src, included header)] -> [(file, header, why)]"""
    out = []
    for file, header in includes:
        if other_architecture(file, header):
            out.append((file, header, "an architecture includes no other architecture"))
            continue
        for checked, banned, why in RULES:
            if any(under(file, c) for c in checked) and any(under(header, b) for b in banned):
                out.append((file, header, why))
                break
    return out


def scan(src):
    includes = []
    for root, _, files in os.walk(src):
        for name in sorted(files):
            if not name.endswith((".h", ".cc")):
                continue
            path = os.path.join(root, name)
            rel = os.path.relpath(path, src).replace(os.sep, "/")
            with open(path, encoding="utf-8") as f:
                for header in INCLUDE.findall(f.read()):
                    includes.append((rel, header))
    return includes


def self_test():
    """Every rule catches a breach of it, and allowed includes pass."""
    samples = [("server/x.cc", "model/model.h"), ("server/x.cc", "kernels/kernels.h"),
               ("model/x.cc", "engine/engine.h"), ("kernels/x.cc", "server/server.h"),
               ("text/x.cc", "kernels/kernels.h"), ("text/jinja/x.cc", "model/config.h"),
               ("image/x.cc", "model/model.h"), ("image/x.cc", "text/chat_template.h"),
               ("base/x.cc", "image/decode.h"),
               ("kernels/avx2/x.cc", "kernels/avx512/avx512.h"), ("engine/x.cc", "tools/make_model.h"),
               ("kernels/x.cc", "model/model.h"), ("base/x.cc", "kernels/kernels.h"),
               ("grammar/x.cc", "engine/engine.h"), ("text/x.cc", "grammar/json_schema.h"),
               ("model/arch/qwen35.cc", "model/arch/qwen3.h"), ("model/blocks/moe.h", "model/arch/qwen3.h"),
               ("model/memory/kv_cache.h", "model/blocks/context.h"), ("model/load/x.cc", "model/decoder.h"),
               ("model/decoder.cc", "model/arch/qwen3.h"), ("model/blocks/x.cc", "model/registry.h"),
               ("engine/scheduler/x.cc", "server/server.h"), ("engine/scheduler/x.h", "cli/commands.h")]
    fine = [("server/x.cc", "engine/engine.h"), ("kernels/avx2/x.cc", "kernels/vec_avx2.h"),
            ("tools/x.cc", "kernels/amx/amx_tiles.h"), ("cli/x.cc", "tools/make_model.h"),
            ("engine/x.cc", "model/model.h"), ("text/jinja/x.cc", "text/tokenizer/unicode.h"),
            ("grammar/x.cc", "text/tokenizer/tokenizer.h"), ("engine/x.cc", "grammar/token_mask.h"),
            ("model/arch/qwen35.cc", "model/arch/qwen35.h"), ("model/registry.cc", "model/arch/qwen3.h"),
            ("model/arch/qwen3.h", "model/blocks/attention.h"), ("model/blocks/moe.h", "model/memory/kv_cache.h"),
            ("model/decoder.h", "model/memory/sequence_memory.h"),
            ("engine/scheduler/x.cc", "model/model.h"), ("server/x.cc", "engine/scheduler/scheduler.h"),
            ("image/x.cc", "base/hash.h"), ("server/x.cc", "image/decode.h"), ("engine/x.cc", "image/processor.h")]
    assert len(breaches(samples)) == len(samples), breaches(samples)
    assert not breaches(fine), breaches(fine)


def main():
    source = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    self_test()
    allow_path = os.path.join(source, "tests", "include_rules_allow.txt")
    allowed = set()
    if os.path.exists(allow_path):
        with open(allow_path, encoding="utf-8") as f:
            for line in f:
                line = line.split("#", 1)[0].strip()
                if line:
                    file, header = (part.strip() for part in line.split(":", 1))
                    allowed.add((file, header))
    found = breaches(scan(os.path.join(source, "src")))
    bad = [b for b in found if (b[0], b[1]) not in allowed]
    stale = allowed - {(b[0], b[1]) for b in found}
    for file, header, why in bad:
        print(f"src/{file} includes {header}: {why}")
    for file, header in sorted(stale):
        print(f"tests/include_rules_allow.txt: {file}: {header} no longer occurs; remove it")
    if bad or stale:
        return 1
    print(f"include rules hold ({len(found)} allowed breach(es) left in include_rules_allow.txt)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
