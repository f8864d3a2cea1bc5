#!/usr/bin/env python3
"""End-to-end: ellm make-model / logits / generate, golden sessions through the CLI, and bad input.

Env: ELLM_BIN (the ellm binary), ELLM_SHARED (the shared folder).
"""
import array
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

BIN = os.environ["ELLM_BIN"]
SHARED = os.environ["ELLM_SHARED"]
VOCAB = 151936
failures = []


def run(*args, env=None):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what, flush=True)
    if not cond:
        failures.append(what)


def must(*args, **kw):
    r = run(*args, **kw)
    if r.returncode != 0:
        print(r.stderr)
        raise SystemExit(f"FAIL  ellm {' '.join(args)} exited {r.returncode}")
    return r


def read_f32(path):
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    return a


def expect_error(what, args, must_name):
    r = run(*args)
    lines = [l for l in r.stderr.splitlines() if l.startswith("error: ")]
    ok = r.returncode == 1 and len(lines) == 1 and must_name in lines[0]
    check(ok, f"{what}: exit {r.returncode}, {lines[-1] if lines else r.stderr.strip()[-200:]}")


def golden_rule(name, logits_path, atol_factor=1):
    """The golden rule (atol_factor 1), or the int8-activation rule (3): err within atol_factor x
    atol at >= 90% of positions, and then the argmax kept at every clear-margin position."""
    g = os.path.join(SHARED, "golden", name)
    s = json.load(open(os.path.join(g, "session.json")))
    P, V = s["positions"], s["vocab_size"]
    L = read_f32(logits_path)
    ids, ref, lse = array.array("i"), read_f32(os.path.join(g, "session_topk_logits.f32")), \
        read_f32(os.path.join(g, "session_lse.f32"))
    ids.frombytes(open(os.path.join(g, "session_topk_ids.i32"), "rb").read())
    K = len(ids) // P
    errs, mismatches = [], 0
    for p in range(P):
        row = L[p * V:(p + 1) * V]
        m = max(row)
        # exp without the shift runs at C speed (map); logits this small cannot overflow it.
        l = math.log(sum(map(math.exp, row))) if m < 600 else m + math.log(math.fsum(math.exp(x - m) for x in row))
        e = max(abs(row[ids[p * K + j]] - ref[p * K + j]) for j in range(K)) + abs(l - lse[p])
        errs.append(e)
        argmax = row.index(m)
        if s["reference_margin"][p] > s["margin_min"] and argmax != s["reference_argmax"][p] and \
                (atol_factor > 1 or e <= s["atol"]):
            mismatches += 1
    errs.sort()
    within = sum(e <= atol_factor * s["atol"] for e in errs) / P
    print(f"      {name}: err p50 {errs[P // 2]:.4f} p90 {errs[int(P * 0.9)]:.4f} max {errs[-1]:.4f}, "
          f"{100 * within:.1f}% within {atol_factor} x atol")
    return within >= 0.9 and mismatches == 0


def main():
    tmp = tempfile.mkdtemp(prefix="ellm_model_cli_")
    try:
        # Golden sessions through `ellm logits` (session.json is accepted as the feeds file): one
        # dense and one hybrid model (every model's numerics: tests/model/golden_test.cc; scoring
        # full logits in Python takes seconds per session). The hybrid sessions are 245 positions.
        for name, positions in [("tiny-qwen3", 95), ("tiny-qwen35", 245)]:
            out = os.path.join(tmp, name + ".f32")
            must("logits", "--model-path", os.path.join(SHARED, "models", name), "--feeds",
                 os.path.join(SHARED, "golden", name, "session.json"), "--out", out)
            check(os.path.getsize(out) == positions * VOCAB * 4,
                  f"{name}: logits file has [{positions}, vocab] floats")
            check(golden_rule(name, out), f"{name}: golden rule through ellm logits")

        # Images: tiny-qwen35-vl's golden session through `ellm logits --images` (its session.json
        # is both the feeds and the images list: each file decoded, prepared and encoded by the
        # tower, its rows at its pads with the 3-D positions that follow; without them the same
        # feeds fail the rule: tests/model/qwen35_vl_test.cc); a model without a tower refuses images.
        vl, vl_session = os.path.join(SHARED, "models", "tiny-qwen35-vl"), os.path.join(SHARED, "golden", "tiny-qwen35-vl", "session.json")
        out = os.path.join(tmp, "vl.f32")
        must("logits", "--model-path", vl, "--feeds", vl_session, "--images", vl_session, "--out", out)
        check(golden_rule("tiny-qwen35-vl", out), "tiny-qwen35-vl: golden rule through ellm logits --images")
        expect_error("images for a model without a tower",
                     ["logits", "--model-path", os.path.join(SHARED, "models", "tiny-qwen3"), "--feeds",
                      os.path.join(SHARED, "golden", "tiny-qwen3", "session.json"), "--images", vl_session,
                      "--out", out], "no vision tower")

        # A 4-bit model through `ellm logits --activations`: BF16 inputs pass the golden rule,
        # int8 inputs the int8 rule, and the two differ.
        awq = os.path.join(SHARED, "models", "tiny-qwen3-awq")
        session = os.path.join(SHARED, "golden", "tiny-qwen3-awq", "session.json")
        outs = {}
        for activations, factor in [("bf16", 1), ("int8", 3)]:
            outs[activations] = os.path.join(tmp, "awq-" + activations + ".f32")
            must("logits", "--model-path", awq, "--feeds", session, "--out", outs[activations],
                 "--activations", activations)
            check(golden_rule("tiny-qwen3-awq", outs[activations], factor),
                  f"tiny-qwen3-awq --activations {activations}: rule within {factor} x atol")
        check(open(outs["bf16"], "rb").read() != open(outs["int8"], "rb").read(),
              "--activations int8 changes the logits")
        r = run("logits", "--model-path", awq, "--feeds", session, "--out", outs["bf16"],
                "--activations", "fp4")
        check(r.returncode != 0 and "--activations" in r.stderr, "--activations fp4 is refused")

        # --kv-cache-dtype: 8-bit KV through `ellm logits` keeps err within 2 x atol at >= 90% of
        # positions (tests/model/golden_kv_dtype.h checks every model and tier), the load line
        # names the dtype, and a bad value is a one-line error.
        qwen3 = os.path.join(SHARED, "models", "tiny-qwen3")
        session = os.path.join(SHARED, "golden", "tiny-qwen3", "session.json")
        out = os.path.join(tmp, "tiny-qwen3-int8kv.f32")
        r = must("logits", "--model-path", qwen3, "--feeds", session, "--out", out, "--kv-cache-dtype", "int8")
        check(golden_rule("tiny-qwen3", out, 2), "tiny-qwen3 --kv-cache-dtype int8: err within 2 x atol")
        check(any(l.startswith("loaded ") and "per token, int8)" in l for l in r.stderr.splitlines()),
              "the load line names the KV dtype")
        for command in (["logits", "--feeds", session, "--out", out], ["serve", "--port", "0"], ["bench"]):
            expect_error(f"{command[0]} --kv-cache-dtype fp4", [*command, "--model-path", qwen3, "--kv-cache-dtype", "fp4"],
                         "--kv-cache-dtype: 'fp4' is not fp16, bf16, int8 or fp8")

        # --attention-products bf16: the golden rule through `ellm logits`, and the load line says
        # whether this tier runs it (AVX-512-BF16, AMX) or stays in FP32; with an int8 cache it
        # stays FP32 and says why; a bad value is a one-line error.
        out_bf16 = os.path.join(tmp, "tiny-qwen3-bf16-attention.f32")
        r = must("logits", "--model-path", qwen3, "--feeds", session, "--out", out_bf16,
                 "--attention-products", "bf16")
        check(golden_rule("tiny-qwen3", out_bf16), "tiny-qwen3 --attention-products bf16: the golden rule")
        load_line = next((l for l in r.stderr.splitlines() if l.startswith("loaded ")), "")
        check("attention on BF16 products" in load_line or "attention in FP32 (--attention-products" in load_line,
              f"the load line names the attention products: {load_line[-120:]}")
        r = must("logits", "--model-path", qwen3, "--feeds", session, "--out", out, "--attention-products", "bf16",
                 "--kv-cache-dtype", "int8")
        check(any(l.startswith("loaded ") and "attention in FP32 (--attention-products bf16 takes an fp16 KV cache"
                  in l for l in r.stderr.splitlines()), "bf16 attention products over an int8 cache: FP32, said so")
        for command in (["logits", "--feeds", session, "--out", out], ["serve", "--port", "0"], ["bench"]):
            expect_error(f"{command[0]} --attention-products fp8", [*command, "--model-path", qwen3, "--attention-products", "fp8"],
                         "--attention-products: 'fp8' is not fp32 or bf16")

        # YaRN: a folder that carries it (the Qwen3 twin), and --rope-scaling on weights without it
        # (Qwen3.5's, factor 4 over an original window of 32), pass the YaRN goldens; other rope
        # types are a one-line error, from the flag or from config.json.
        for name, folder, flag in [("tiny-qwen3-yarn", "tiny-qwen3-yarn", []),
                                   ("tiny-qwen35-yarn", "tiny-qwen35", ["--rope-scaling", "yarn:4:32"])]:
            session = os.path.join(SHARED, "golden", name, "session.json")
            out = os.path.join(tmp, folder + "-yarn.f32")
            must("logits", "--model-path", os.path.join(SHARED, "models", folder), "--feeds", session,
                 "--out", out, *flag)
            check(golden_rule(name, out), f"{folder} {' '.join(flag)}: {name} golden rule through ellm logits")
        qwen3 = os.path.join(SHARED, "models", "tiny-qwen3")
        session = os.path.join(SHARED, "golden", "tiny-qwen3", "session.json")
        for command in (["logits", "--feeds", session, "--out", os.path.join(tmp, "x.f32")],
                        ["serve", "--port", "0"], ["bench"]):
            r = run(*command, "--model-path", qwen3, "--rope-scaling", "longrope:4")
            check(r.returncode != 0 and "rope type 'longrope' is not supported (supported: default, yarn)"
                  in r.stderr and len(r.stderr.strip().splitlines()) == 1,
                  f"{command[0]} --rope-scaling longrope:4 is a one-line error: {r.stderr.strip()!r}")
        longrope = os.path.join(tmp, "tiny-qwen3-longrope")
        os.mkdir(longrope)
        for f in os.listdir(qwen3):
            os.symlink(os.path.join(qwen3, f), os.path.join(longrope, f))
        config = json.load(open(os.path.join(qwen3, "config.json")))
        config["rope_scaling"] = {"rope_type": "longrope", "factor": 4.0, "long_factor": [1.0], "short_factor": [1.0]}
        os.remove(os.path.join(longrope, "config.json"))
        json.dump(config, open(os.path.join(longrope, "config.json"), "w"))
        r = run("logits", "--model-path", longrope, "--feeds", session, "--out", os.path.join(tmp, "x.f32"))
        check(r.returncode != 0 and "rope type 'longrope' is not supported (supported: default, yarn)" in r.stderr,
              f"a config with rope_type longrope is refused: {r.stderr.strip()!r}")

        # make-model: single file, sharded, MoE; the same seed gives the same weights.
        tiny, sharded, moe = (os.path.join(tmp, n) for n in ["tiny", "tiny-sharded", "tiny-moe"])
        must("make-model", "--preset", "tiny", "--seed", "3", "--out", tiny)
        must("make-model", "--preset", "tiny", "--seed", "3", "--shards", "3", "--out", sharded)
        must("make-model", "--preset", "tiny-moe", "--seed", "3", "--shards", "2", "--out", moe)
        for d in [tiny, sharded, moe]:
            for f in ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                      "chat_template.jinja"]:
                check(os.path.exists(os.path.join(d, f)), f"{os.path.basename(d)} has {f}")
        gen = json.load(open(os.path.join(tiny, "generation_config.json")))
        check(gen["eos_token_id"] == [151645, 151643] and gen["top_k"] == 20, "generation_config keys")
        index = json.load(open(os.path.join(sharded, "model.safetensors.index.json")))
        check(len(set(index["weight_map"].values())) == 3, "sharded model uses 3 shards")

        feeds = os.path.join(tmp, "feeds.json")
        json.dump([[1, 2, 3, 4, 5], [6], [7, 8]], open(feeds, "w"))
        outs = {}
        for d in [tiny, sharded, moe]:
            out = os.path.join(tmp, os.path.basename(d) + ".f32")
            must("logits", "--model-path", d, "--feeds", feeds, "--out", out)
            L = read_f32(out)
            check(len(L) == 8 * VOCAB and all(math.isfinite(x) for x in L[:VOCAB]),
                  f"{os.path.basename(d)}: 8 finite logit rows")
            outs[d] = open(out, "rb").read()
        check(outs[tiny] == outs[sharded], "sharded and single-file models give identical logits")

        r = must("generate", "--model-path", moe, "--prompt-ids", "1,2,3", "--max-tokens", "5")
        ids = [int(x) for x in r.stdout.strip().split(",")]
        check(len(ids) == 5 and all(0 <= i < VOCAB for i in ids), f"generate prints 5 ids: {ids}")
        # Greedy generation agrees with the logits of the same tokens fed back.
        json.dump([[1, 2, 3] + ids[:-1]], open(feeds, "w"))
        out = os.path.join(tmp, "check.f32")
        must("logits", "--model-path", moe, "--feeds", feeds, "--out", out)
        L = read_f32(out)
        argmax = [max(range(VOCAB), key=L[p * VOCAB:(p + 1) * VOCAB].__getitem__) for p in range(2, 7)]
        check(argmax == ids, "generate follows the argmax of logits")

        # Qwen3.8-Flash-Next's tiny preset in FP8 (E4M3 matrices and n-gram table) loads and
        # generates; 4-bit dtypes and --fused-experts are refused for it.
        q4 = os.path.join(tmp, "tiny-qwen4exp-fp8")
        must("make-model", "--preset", "tiny-qwen4exp", "--dtype", "fp8", "--shards", "2", "--out", q4)
        config = json.load(open(os.path.join(q4, "config.json")))
        check(config["model_type"] == "qwen4_exp" and config["quantization_config"]["quant_method"] == "fp8"
              and config["text_config"]["ple_layer_ids"] == [2], "tiny-qwen4exp fp8 config")
        r = must("generate", "--model-path", q4, "--prompt-ids", "1,2,151643,4", "--max-tokens", "4")
        ids = [int(x) for x in r.stdout.strip().split(",")]
        check(len(ids) == 4 and all(0 <= i < VOCAB for i in ids), f"tiny-qwen4exp fp8 generates 4 ids: {ids}")
        expect_error("qwen4exp gptq", ["make-model", "--preset", "tiny-qwen4exp", "--dtype", "gptq", "--out",
                                       os.path.join(tmp, "q4-gptq")], "--dtype: Qwen3.8-Flash-Next is written as bf16 or fp8")
        expect_error("qwen4exp fused", ["make-model", "--preset", "tiny-qwen4exp", "--fused-experts", "--out",
                                        os.path.join(tmp, "q4-fused")], "--fused-experts")

        # ellm bench: machine limits, then prefill and decode rows, each decode row judged part by
        # part against read bandwidths taken between the parts; --zero-context decodes at a context without a prefill.
        bench_json = os.path.join(tmp, "bench.jsonl")
        r = must("bench", "--model-path", tiny, "--prompt-lengths", "32", "--decode-batches", "1,2",
                 "--decode-contexts", "32,300", "--zero-context", "--decode-steps", "4", "--busy", "false",
                 "--json", bench_json)
        rows = [json.loads(line) for line in open(bench_json)]
        kinds = [(x["kind"], x.get("batch"), x.get("context")) for x in rows]
        check(kinds == [("machine", None, None), ("decode", 1, 64), ("decode", 2, 64), ("prefill", None, None),
                        ("decode_context", 1, 32), ("decode_context", 1, 300)], f"bench rows: {kinds}")
        check(rows[0]["peak_flops"] > 0 and rows[0]["read_bandwidth"] > 0, "bench measures the machine")
        decodes = [x for x in rows if x["kind"].startswith("decode")]
        def median(v):
            v = sorted(v)
            return (v[(len(v) - 1) // 2] + v[len(v) // 2]) / 2
        # 4 steps: 4 parts of one step, with 5 readings of the read bandwidth around them.
        check(all(x["read_bandwidth_gbs"] > 0 and x["tokens_per_s"] > 0 and
                  len(x["part_fractions_of_bandwidth"]) == 4 and len(x["part_read_bandwidths_gbs"]) == 5 and
                  abs(x["fraction_of_bandwidth"] - median(x["part_fractions_of_bandwidth"])) < 1e-9 and
                  abs(x["fraction_of_bandwidth_whole_run"] * max(x["part_read_bandwidths_gbs"][0], x["part_read_bandwidths_gbs"][-1])
                      - x["achieved_bandwidth_gbs"]) < 1e-6 * x["achieved_bandwidth_gbs"]
                  for x in decodes), "each decode row: tokens/s, and bandwidth part by part against readings beside each part")
        check(all(x["sleeps_per_step"] >= 0 for x in decodes), "each decode row counts the threads' sleeps per step")
        check(all(isinstance(x["solo_switches"], int) and x["solo_switches"] >= 0 for x in decodes),
              "each decode row counts the team's switches to one thread")
        check([x["context_filled_by"] for x in decodes if x["kind"] == "decode_context"] == ["prefill", "zeros"],
              "a context that is also a prompt length is prefilled; the other one is zeros")
        check(decodes[-1]["bytes_per_step"] > decodes[0]["bytes_per_step"],
              "decode at context 300 reads more bytes per step (K/V) than at 64")
        # The step beside its weight stream: shares of the step that add up, the team's runs the
        # same count every step (a fixed plan per layer), members' idle a share of their time.
        for x in decodes:
            st = x["step"]
            shares = st["products_share"] + st["lm_head_share"] + st["other_ops_share"] + st["between_ops_share"]
            check(abs(shares - 1) < 1e-6 and st["products_share"] > 0 and st["lm_head_share"] > 0 and
                  st["step_ms"] > 0 and 0 <= st["caller_alone_share"] < 1 and 0 <= st["members_idle_share"] < 1,
                  f"decode step breakdown: {st}")
            check(st["team_runs_per_step"] >= 2 and st["team_runs_per_step"] == int(st["team_runs_per_step"]),
                  f"the team's runs per step: {st}")
        check(len({x["step"]["team_runs_per_step"] for x in decodes if x["kind"] == "decode"}) == 1,
              "batch 1 and 2 run the same plan of team runs per step")
        check("decode step beside its weight stream" in r.stdout and "members idle" in r.stdout,
              "bench prints the decode step's breakdown")
        check("% of read" in r.stdout, "bench prints its table")
        check(all(x["kv_cache_dtype"] == "fp16" for x in rows[1:]), "bench rows name the KV dtype")
        check(all(x["attention_products"] == "fp32" for x in rows[1:]), "bench rows name the attention products")
        # With an FP8 KV cache, the zeroed context decodes too, and the rows say so, with its bytes.
        fp8_json = os.path.join(tmp, "bench-fp8.jsonl")
        must("bench", "--model-path", tiny, "--prompt-lengths", "", "--decode-batches", "1",
             "--decode-contexts", "300", "--zero-context", "--decode-steps", "2", "--busy", "false",
             "--kv-cache-dtype", "fp8", "--json", fp8_json)
        fp8_rows = [json.loads(line) for line in open(fp8_json)][1:]
        check(fp8_rows and all(x["kv_cache_dtype"] == "fp8" and x["tokens_per_s"] > 0 for x in fp8_rows) and
              fp8_rows[0]["kv_bytes_per_token"] < rows[1]["kv_bytes_per_token"] * 0.6,
              f"bench --kv-cache-dtype fp8 --zero-context: {[(x['kind'], x['kv_bytes_per_token']) for x in fp8_rows]}")
        # A context's rows give the KV committed against what its positions need (whole pages).
        contexts = [x for x in decodes if x["kind"] == "decode_context"] + [x for x in fp8_rows if x["kind"] == "decode_context"]
        check(contexts and all(x["kv_committed_bytes"] >= x["kv_needed_bytes"] == x["kv_bytes_per_token"] * x["context"]
                               for x in contexts), f"bench: KV committed against needed: {[(x['kv_committed_bytes'], x['kv_needed_bytes']) for x in contexts]}")
        check("KV at context 300:" in r.stdout, "bench prints the KV committed at each context")
        # A hybrid model's context is zeros too: its recurrent state set to zeros at the context's end.
        hybrid_json = os.path.join(tmp, "bench-hybrid.jsonl")
        must("bench", "--model-path", os.path.join(SHARED, "models", "tiny-qwen35"), "--prompt-lengths", "",
             "--decode-batches", "", "--decode-contexts", "300", "--zero-context", "--decode-steps", "2",
             "--busy", "false", "--image-size", "", "--json", hybrid_json)
        hybrid_rows = [json.loads(line) for line in open(hybrid_json)][1:]
        check([(x["kind"], x.get("context_filled_by")) for x in hybrid_rows] == [("decode_context", "zeros")] and
              hybrid_rows[0]["tokens_per_s"] > 0 and hybrid_rows[0]["state_bytes_per_slot"] > 0,
              f"bench --zero-context on a hybrid model: {[(x['kind'], x.get('context_filled_by')) for x in hybrid_rows]}")

        # Qwen3.8-Flash-Next's context as zeros: no prefill, so no cold-table prefill either; past
        # its indexer's budget (32 positions) the step's profile has the indexer's block scores,
        # attention over the kept positions only, the hyper-connection mixes and the n-gram module.
        q4_json = os.path.join(tmp, "bench-q4.jsonl")
        must("bench", "--model-path", os.path.join(SHARED, "models", "tiny-qwen4exp"), "--prompt-lengths", "",
             "--decode-batches", "", "--decode-contexts", "300", "--zero-context", "--decode-steps", "2",
             "--busy", "false", "--image-size", "", "--json", q4_json)
        q4_rows = [json.loads(line) for line in open(q4_json)][1:]
        q4_ops = {o["op"]: o for o in q4_rows[0]["ops"]} if q4_rows else {}
        check([x["kind"] for x in q4_rows] == ["decode_context"] and q4_rows[0]["tokens_per_s"] > 0 and
              all(q4_ops.get(op, {}).get("bytes", 0) > 0 for op in ("indexer", "attention", "hyper_mix", "ngram_proj")),
              f"bench --zero-context on tiny-qwen4exp: {[x['kind'] for x in q4_rows]}, ops {sorted(q4_ops)}")

        # The busy row: another process spins on a core during one decode run, and is gone after.
        busy_json = os.path.join(tmp, "bench-busy.jsonl")
        must("bench", "--model-path", tiny, "--prompt-lengths", "", "--decode-batches", "1",
             "--decode-contexts", "", "--decode-steps", "4", "--json", busy_json)
        rows = [json.loads(line) for line in open(busy_json)]
        check([x["kind"] for x in rows] == ["machine", "decode", "decode_busy"] and rows[2]["tokens_per_s"] > 0,
              f"bench measures decode with a busy core: {[x['kind'] for x in rows]}")
        left = []
        for pid in os.listdir("/proc"):
            try:
                if pid.isdigit() and busy_json.encode() in open(f"/proc/{pid}/cmdline", "rb").read():
                    left.append(pid)
            except OSError:
                pass
        check(not left, f"no busy process is left running after bench: {left}")

        # Bad input: non-zero exit and one line naming the file.
        empty = os.path.join(tmp, "empty")
        os.makedirs(empty)
        expect_error("missing config.json", ["logits", "--model-path", empty, "--feeds", feeds, "--out", out],
                     os.path.join(empty, "config.json"))
        bad_arch = os.path.join(tmp, "bad-arch")
        shutil.copytree(tiny, bad_arch)
        cfg = json.load(open(os.path.join(bad_arch, "config.json")))
        cfg["architectures"] = ["GPT2LMHeadModel"]
        json.dump(cfg, open(os.path.join(bad_arch, "config.json"), "w"))
        expect_error("unknown architecture", ["generate", "--model-path", bad_arch, "--prompt-ids", "1"],
                     "config.json: unsupported architecture 'GPT2LMHeadModel'")
        json.dump([[1, 2], [VOCAB]], open(feeds, "w"))
        expect_error("token id outside the vocabulary",
                     ["logits", "--model-path", tiny, "--feeds", feeds, "--out", out], feeds)
        json.dump([list(range(10))], open(feeds, "w"))
        expect_error("more tokens than --sequence-length",
                     ["logits", "--model-path", tiny, "--feeds", feeds, "--out", out, "--sequence-length", "8"],
                     feeds + ": 10 tokens exceed --sequence-length 8")
        expect_error("generate beyond --sequence-length",
                     ["generate", "--model-path", tiny, "--prompt-ids", "1,2", "--max-tokens", "9",
                      "--sequence-length", "10"], "--sequence-length 10")
        os.remove(os.path.join(sharded, "model-00002-of-00003.safetensors"))
        expect_error("index pointing at a missing shard",
                     ["generate", "--model-path", sharded, "--prompt-ids", "1"],
                     "model.safetensors.index.json: shard 'model-00002-of-00003.safetensors' does not exist")
        st = os.path.join(tiny, "model.safetensors")
        data = open(st, "rb").read()
        open(st, "wb").write(data[:1000])
        expect_error("truncated safetensors header", ["generate", "--model-path", tiny, "--prompt-ids", "1"],
                     st + ": header length")
        open(st, "wb").write(data[:8] + b"\x00" * 40 + data[48:])
        expect_error("corrupt safetensors header", ["generate", "--model-path", tiny, "--prompt-ids", "1"],
                     st + ": corrupt safetensors header")
        expect_error("unknown preset", ["make-model", "--preset", "qwen9", "--out", empty], "--preset")

        # A full-depth Qwen3-0.6B shape loads and runs.
        q06 = os.path.join(tmp, "qwen3-0.6b")
        must("make-model", "--preset", "qwen3-0.6b", "--out", q06)
        r = must("generate", "--model-path", q06, "--prompt-ids", ",".join(str(i) for i in range(100, 132)),
                 "--max-tokens", "4")
        loaded = [l for l in r.stderr.splitlines() if l.startswith("loaded ")]
        print("      " + (loaded[0] if loaded else "no load line"))
        print("      " + r.stderr.strip().splitlines()[-1])
        check(len(r.stdout.strip().split(",")) == 4 and loaded and "resident" in loaded[0],
              "qwen3-0.6b generates 4 tokens and reports load time and resident memory")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print(f"{len(failures)} failure(s)")
        sys.exit(1)
    print("all passed")


if __name__ == "__main__":
    main()
