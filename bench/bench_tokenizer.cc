// Tokenizer speed: encoding a ~1 MB mixed code-and-prose document (MB/s), decoding it, and
// loading tokenizer.json (the server does that at start).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "text/tokenizer/tokenizer.h"

namespace {

const std::string kModelDir = std::string(ELLM_SHARED) + "/text/qwen3";

const ellm::Tokenizer& qwen3() {
  static auto tokenizer = ellm::Tokenizer::load(kModelDir);
  return *tokenizer;
}

// Deterministic ~1 MB document: half real snippets (prose, code in several languages, CJK,
// emoji, numbers, whitespace runs from the test vectors), half generated prose in several
// scripts and C-like code. Generated words come from a 20k-word lexicon of random syllables,
// drawn with Zipf-like frequencies as in real text, so the document is not one repeated page.
const std::string& mixed_document() {
  static const std::string doc = [] {
    std::vector<std::string> snippets;
    std::ifstream in(std::string(ELLM_SHARED) + "/text/tokenizer_vectors.jsonl");
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) snippets.push_back(nlohmann::json::parse(line)["text"].get<std::string>());
    const std::vector<std::string> syllables = {
        "ka", "to", "ri", "men", "sel", "and", "the", "ver", "qu", "ion", "str", "ing", "café", "über",
        "прив", "ет", "мир", "λόγ", "ος", "数据", "模型", "トークン", "한국", "어", "😀", "🚀", "naïve", "ß"};
    const std::vector<std::string> code = {"int ", "return ", "if (", ") {\n", "  ", "}\n", " = ", ";\n",
                                           "for (auto& ", " : ", "->", "::", "std::vector<", ">", "(", ")",
                                           "    ", "// ", "\t", "0x", "\n\n", "#include <", "== nullptr"};
    std::mt19937 rng(42);
    std::vector<std::string> lexicon(20000);
    for (std::string& w : lexicon)
      for (unsigned n = 1 + rng() % 4; n > 0; --n) w += syllables[rng() % syllables.size()];
    auto word = [&] {  // Zipf-like: rank r is drawn with probability ~ 1/r
      double u = (rng() % 1000000 + 0.5) / 1e6;
      size_t rank = static_cast<size_t>(std::pow(static_cast<double>(lexicon.size()), u)) - 1;
      return lexicon[std::min(rank, lexicon.size() - 1)];
    };
    std::string text;
    while (text.size() < (1 << 20)) {
      switch (rng() % 4) {
        case 0:
        case 1:
          text += snippets[rng() % snippets.size()];
          text += "\n";
          break;
        case 2:  // a paragraph of prose
          for (unsigned n = 20 + rng() % 40; n > 0; --n) text += word() + (rng() % 9 == 0 ? ", " : " ");
          text += ".\n\n";
          break;
        default:  // a block of code with fresh identifiers and numbers
          for (unsigned n = 20 + rng() % 40; n > 0; --n) {
            text += code[rng() % code.size()];
            if (rng() % 2) text += word() + "_" + std::to_string(rng() % 1000);
          }
          text += "\n";
      }
    }
    return text;
  }();
  return doc;
}

void BM_EncodeMixedDocument(benchmark::State& state) {
  const std::string& doc = mixed_document();
  size_t tokens = 0;
  for (auto _ : state) {
    std::vector<int32_t> ids = qwen3().encode(doc);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * doc.size()));
  state.counters["doc_MB"] = doc.size() / 1e6;
  state.counters["tokens"] = static_cast<double>(tokens);
}
BENCHMARK(BM_EncodeMixedDocument)->Unit(benchmark::kMillisecond)->MinTime(2.0);

void BM_DecodeMixedDocument(benchmark::State& state) {
  const std::vector<int32_t> ids = qwen3().encode(mixed_document());
  for (auto _ : state) benchmark::DoNotOptimize(qwen3().decode(ids, false));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * mixed_document().size()));
}
BENCHMARK(BM_DecodeMixedDocument)->Unit(benchmark::kMillisecond);

void BM_IncrementalDetokenize(benchmark::State& state) {
  const std::vector<int32_t> ids = qwen3().encode(mixed_document());
  for (auto _ : state) {
    ellm::IncrementalDetokenizer detok(qwen3(), false);
    size_t bytes = 0;
    for (int32_t id : ids) bytes += detok.push(id).size();
    benchmark::DoNotOptimize(bytes);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ids.size()));  // tokens/s
}
BENCHMARK(BM_IncrementalDetokenize)->Unit(benchmark::kMillisecond);

void BM_LoadTokenizer(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(ellm::Tokenizer::load(kModelDir));
}
BENCHMARK(BM_LoadTokenizer)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
