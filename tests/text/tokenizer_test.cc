#include "text/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <atomic>
#include <functional>
#include <unistd.h>
#include <algorithm>
#include <sstream>

#include "base/error.h"
#include "text/tokenizer/bpe.h"
#include "text/tokenizer/unicode.h"

namespace ellm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kModelDir = std::string(ELLM_SHARED) + "/text/qwen3";

struct Vector {
  std::string name, text, decoded, decoded_skip_special;
  std::vector<int32_t> ids;
};

const std::vector<Vector>& vectors() {
  static const std::vector<Vector> all = [] {
    std::vector<Vector> v;
    std::ifstream in(std::string(ELLM_SHARED) + "/text/tokenizer_vectors.jsonl");
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      json j = json::parse(line);
      v.push_back({j["name"], j["text"], j["decoded"], j["decoded_skip_special"], j["ids"]});
    }
    return v;
  }();
  return all;
}

const Tokenizer& qwen3() {
  static const std::shared_ptr<const Tokenizer> tokenizer = Tokenizer::load(kModelDir);
  return *tokenizer;
}

std::string stream_decode(const Tokenizer& tokenizer, const std::vector<int32_t>& ids, bool skip) {
  IncrementalDetokenizer detok(tokenizer, skip);
  std::string text;
  for (int32_t id : ids) {
    std::string piece = detok.push(id);
    EXPECT_EQ(unicode::find_invalid_utf8(piece), unicode::kValid) << "push emitted a broken character";
    text += piece;
  }
  return text + detok.flush();
}

TEST(TokenizerVectors, FileHasCases) { ASSERT_GE(vectors().size(), 100u); }

TEST(TokenizerVectors, EncodeMatchesHuggingFace) {
  int passed = 0;
  for (const Vector& v : vectors()) {
    std::vector<int32_t> ids = qwen3().encode(v.text);
    EXPECT_EQ(ids, v.ids) << v.name;
    passed += ids == v.ids;
  }
  std::printf("encode: %d/%zu vectors match\n", passed, vectors().size());
}

TEST(TokenizerVectors, DecodeMatchesHuggingFace) {
  int passed = 0;
  for (const Vector& v : vectors()) {
    std::string all = qwen3().decode(v.ids, false), skipped = qwen3().decode(v.ids, true);
    EXPECT_EQ(all, v.decoded) << v.name;
    EXPECT_EQ(skipped, v.decoded_skip_special) << v.name;
    passed += all == v.decoded && skipped == v.decoded_skip_special;
  }
  std::printf("decode: %d/%zu vectors match (with and without special tokens)\n", passed, vectors().size());
}

TEST(TokenizerVectors, IncrementalDetokenizerEqualsWholeDecode) {
  int passed = 0;
  for (const Vector& v : vectors()) {
    bool ok = true;
    for (bool skip : {false, true}) {
      std::string streamed = stream_decode(qwen3(), v.ids, skip);
      EXPECT_EQ(streamed, qwen3().decode(v.ids, skip)) << v.name << " skip=" << skip;
      ok &= streamed == qwen3().decode(v.ids, skip);
    }
    passed += ok;
  }
  std::printf("incremental: %d/%zu vectors match whole-sequence decode\n", passed, vectors().size());
}

TEST(Tokenizer, VocabularyFacts) {
  const Tokenizer& t = qwen3();
  EXPECT_EQ(t.vocab_size(), 151669);
  EXPECT_EQ(t.token_to_id("!"), 0);
  EXPECT_EQ(t.token_to_id("Ġworld"), 1879);  // byte-level spelling of " world"
  EXPECT_EQ(t.token_bytes(1879), " world");
  EXPECT_EQ(t.token_to_id("<|im_end|>"), 151645);
  EXPECT_EQ(t.token_to_id("no-such-token-xyz"), std::nullopt);
  EXPECT_TRUE(t.is_special(151643));
  EXPECT_TRUE(t.is_special(151656));
  EXPECT_FALSE(t.is_special(151667));  // <think> is added but not special
  EXPECT_FALSE(t.is_special(1879));
  EXPECT_EQ(t.token_bytes(151667), "<think>");
  EXPECT_EQ(t.token_bytes(198), "\n");
}

TEST(Tokenizer, AddedTokenLookalikesAreText) {
  std::vector<int32_t> ids = qwen3().encode("<|im_end|");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 151645), 0);
  EXPECT_EQ(qwen3().decode(ids, false), "<|im_end|");
}

TEST(Tokenizer, InvalidUtf8IsAnError) {
  for (std::string bad : {std::string("abc\xff"), std::string("\xc3"), std::string("\xed\xa0\x80"),
                          std::string("ok \xe4\xb8 then"), std::string("\xc0\xaf")}) {
    try {
      qwen3().encode(bad);
      ADD_FAILURE() << "no error for invalid UTF-8";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("invalid UTF-8"), std::string::npos) << e.what();
    }
  }
}

TEST(Tokenizer, UnknownIdIsAnError) {
  std::vector<int32_t> ids{9707, -1};
  EXPECT_THROW(qwen3().decode(ids, false), Error);
  ids = {151669};
  EXPECT_THROW(qwen3().decode(ids, true), Error);
  IncrementalDetokenizer detok(qwen3(), false);
  EXPECT_THROW(detok.push(1 << 30), Error);
}

// The case an independent vector set found: spaces, U+180E MONGOLIAN VOWEL SEPARATOR, vertical
// tabs. Hugging Face's regex engine (Oniguruma, Unicode 14.0) does not count U+180E as \s (it has
// been Cf since Unicode 6.3), so the Qwen pattern splits it into three pieces, which BPE encodes
// separately: nine spaces (\s+(?!\S) stops before the space that precedes a non-space), then
// " \u180E" ( ?[^\s\p{L}\p{N}]+), then the vertical tabs (\s+). Taking U+180E for white space, as
// PCRE2's \s does, made the whole run one piece and merged across those boundaries.
TEST(Tokenizer, MongolianVowelSeparatorIsNotWhiteSpace) {
  const std::string mvs = "\xE1\xA0\x8E";  // U+180E
  std::vector<int32_t> expected;
  for (const std::string& piece : {std::string(9, ' '), " " + mvs, std::string("\v\v")}) {
    std::vector<int32_t> ids = qwen3().encode(piece);
    expected.insert(expected.end(), ids.begin(), ids.end());
  }
  EXPECT_EQ(qwen3().encode(std::string(10, ' ') + mvs + "\v\v"), expected);
  // U+0085 (NEL) is white space for both, so it stays in the run of spaces.
  std::vector<int32_t> nel = qwen3().encode(std::string(10, ' ') + "\xC2\x85\v\v");
  EXPECT_EQ(qwen3().decode(nel, false), std::string(10, ' ') + "\xC2\x85\v\v");
}

TEST(Tokenizer, LongRunsAreLinearNotStuck) {
  for (std::string unit : {"a", " ", "\n", "1", "é", "!", " \t"}) {
    std::string text;
    for (int i = 0; i < 20000; ++i) text += unit;
    std::vector<int32_t> ids = qwen3().encode(text);
    EXPECT_FALSE(ids.empty());
    EXPECT_EQ(qwen3().decode(ids, false), text);
  }
}

TEST(BpeMerges, ScanAndHeapStrategiesAgree) {
  // A random merge table over a 4-symbol alphabet (dense, so long words merge a lot and ties
  // between equal pairs are common), and random words on both code paths.
  std::mt19937 rng(7);
  BpeMerges merges;
  int32_t next_id = 4;
  for (int32_t rank = 0; rank < 300; ++rank, ++next_id) {
    int32_t left = rng() % next_id, right = rng() % next_id;
    merges.add(left, right, next_id, rank);
  }
  for (int round = 0; round < 3000; ++round) {
    std::vector<int32_t> word(1 + rng() % 64);
    for (int32_t& id : word) id = rng() % 4;
    std::vector<int32_t> by_scan = word, by_heap = word;
    by_scan.resize(merges.merge_by_scan(by_scan.data(), by_scan.size()));
    by_heap.resize(merges.merge_by_heap(by_heap.data(), by_heap.size()));
    ASSERT_EQ(by_scan, by_heap) << "round " << round;
  }
  std::vector<int32_t> aaaa{0, 0, 0};  // equal pairs: the leftmost merges first
  BpeMerges aa;
  aa.add(0, 0, 9, 0);
  aaaa.resize(aa.apply(aaaa.data(), aaaa.size()));
  EXPECT_EQ(aaaa, (std::vector<int32_t>{9, 0}));
}

// Python's bytes.decode('utf-8', 'replace') on the same bytes, which Hugging Face uses.
TEST(Utf8, LossyDecodingReplacesMaximalSubparts) {
  auto lossy = [](std::string bytes) {
    std::string out;
    unicode::append_utf8_lossy(bytes, true, out);
    return out;
  };
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(lossy("a\xe4\xb8"), "a" + fffd);
  EXPECT_EQ(lossy("\xe4\xb8" "a"), fffd + "a");
  EXPECT_EQ(lossy("\xff\xfe"), fffd + fffd);
  EXPECT_EQ(lossy("\xed\xa0\x80"), fffd + fffd + fffd);  // surrogate
  EXPECT_EQ(lossy("\xf0\x80\x80"), fffd + fffd + fffd);  // overlong
  EXPECT_EQ(lossy("\xf4\x90\x80\x80"), fffd + fffd + fffd + fffd);  // above U+10FFFF
  EXPECT_EQ(lossy("\xc0\xaf"), fffd + fffd);
  EXPECT_EQ(lossy("\xf0\x9f\x98"), fffd);
  EXPECT_EQ(lossy("\xf0\x9f\x98\x80"), "\xf0\x9f\x98\x80");
}

TEST(Tokenizer, StreamingSplitCharactersWaitForCompletion) {
  // Byte tokens of "😀" (F0 9F 98 80) pushed one by one: nothing until the last byte.
  const std::string emoji = "\xf0\x9f\x98\x80";
  IncrementalDetokenizer detok(qwen3(), false);
  std::vector<int32_t> ids;
  for (unsigned char b : emoji) {
    std::string spelled;
    unicode::append_utf8(unicode::byte_to_codepoint()[b], spelled);
    auto id = qwen3().token_to_id(spelled);
    ASSERT_TRUE(id.has_value());
    ids.push_back(*id);
  }
  EXPECT_EQ(detok.push(ids[0]), "");
  EXPECT_EQ(detok.push(ids[1]), "");
  EXPECT_EQ(detok.push(ids[2]), "");
  EXPECT_EQ(detok.push(ids[3]), emoji);
  EXPECT_EQ(detok.flush(), "");
}

TEST(Tokenizer, StreamingEqualsDecodeOnRandomIds) {
  // Random mixes of byte tokens, multi-byte tokens and special tokens exercise every
  // broken-character path; streaming must still equal the one-shot decode.
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> any(0, static_cast<int>(qwen3().vocab_size()) - 1);
  std::uniform_int_distribution<int> low(0, 300), special(151643, 151668), kind(0, 3);
  for (int round = 0; round < 500; ++round) {
    std::vector<int32_t> ids(1 + round % 23);
    for (int32_t& id : ids) {
      int k = kind(rng);
      id = k == 0 ? any(rng) : k == 3 ? special(rng) : low(rng);
    }
    for (bool skip : {false, true}) ASSERT_EQ(stream_decode(qwen3(), ids, skip), qwen3().decode(ids, skip));
  }
}

TEST(Tokenizer, ThreadsEncodeConcurrently) {
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (const Vector& v : vectors())
        if (qwen3().encode(v.text) != v.ids) ++mismatches;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// --- Bad model folders -----------------------------------------------------------------

class BadTokenizerFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ellm_tok_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& content) {
    std::ofstream(dir_ / name, std::ios::binary) << content;
  }
  // A tiny valid byte-level tokenizer.json with an overridable body.
  static json minimal() {
    json vocab = json::object();
    for (int b = 0; b < 256; ++b) {
      std::string spelled;
      unicode::append_utf8(unicode::byte_to_codepoint()[b], spelled);
      vocab[spelled] = b;
    }
    vocab["ab"] = 256;
    return json{{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({json::array({"a", "b"})})}}},
                {"normalizer", {{"type", "NFC"}}},
                {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                {"added_tokens", json::array({{{"id", 257}, {"content", "<|x|>"}, {"special", true}}})}};
  }
  std::string error_of_load() {
    try {
      Tokenizer::load(dir_.string());
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
};

TEST_F(BadTokenizerFiles, MinimalFileWorks) {
  write("tokenizer.json", minimal().dump());
  auto t = Tokenizer::load(dir_.string());
  EXPECT_EQ(t->encode("ab<|x|>a"), (std::vector<int32_t>{256, 257, 'a'}));
  EXPECT_EQ(t->vocab_size(), 258);
  std::vector<int32_t> ids{256, 257};
  EXPECT_EQ(t->decode(ids, true), "ab");
}

TEST_F(BadTokenizerFiles, MissingFile) {
  std::string e = error_of_load();
  EXPECT_NE(e.find("tokenizer.json"), std::string::npos) << e;
  EXPECT_NE(e.find("cannot open"), std::string::npos) << e;
}

TEST_F(BadTokenizerFiles, NotJson) {
  write("tokenizer.json", "{\"model\": {\"vocab\": ");
  EXPECT_NE(error_of_load().find("not valid JSON"), std::string::npos);
}

TEST_F(BadTokenizerFiles, StructuralProblemsNameTheFile) {
  std::vector<std::pair<std::string, std::function<void(json&)>>> breakages = {
      {"no vocab", [](json& j) { j["model"].erase("vocab"); }},
      {"vocab is array", [](json& j) { j["model"]["vocab"] = json::array(); }},
      {"merge of unknown", [](json& j) { j["model"]["merges"].push_back(json::array({"zz", "q"})); }},
      {"merge wrong shape", [](json& j) { j["model"]["merges"].push_back(42); }},
      {"negative id", [](json& j) { j["model"]["vocab"]["xyz"] = -3; }},
      {"huge id", [](json& j) { j["model"]["vocab"]["xyz"] = 1LL << 40; }},
      {"string id", [](json& j) { j["model"]["vocab"]["xyz"] = "7"; }},
      {"missing byte", [](json& j) { j["model"]["vocab"].erase("a"); j["model"]["merges"] = json::array(); }},
      {"bad regex", [](json& j) {
         j["pre_tokenizer"] = {{"type", "Split"}, {"behavior", "Isolated"}, {"pattern", {{"Regex", "(\\p{L"}}}};
       }},
      {"unknown normalizer", [](json& j) { j["normalizer"] = {{"type", "Lowercase"}}; }},
      {"wordpiece", [](json& j) { j["model"]["type"] = "WordPiece"; }},
      {"added token without content", [](json& j) { j["added_tokens"][0].erase("content"); }},
      {"added tokens not array", [](json& j) { j["added_tokens"] = 5; }},
      {"top level array", [](json& j) { j = json::array(); }},
  };
  for (auto& [name, breakage] : breakages) {
    json j = minimal();
    breakage(j);
    write("tokenizer.json", j.dump());
    std::string e = error_of_load();
    EXPECT_NE(e.find("tokenizer.json"), std::string::npos) << name << ": '" << e << "'";
  }
}

TEST_F(BadTokenizerFiles, BadConfigNamesTheFile) {
  write("tokenizer.json", minimal().dump());
  write("tokenizer_config.json", R"({"added_tokens_decoder": {"x": {"content": "<y>"}}})");
  EXPECT_NE(error_of_load().find("tokenizer_config.json"), std::string::npos);
  write("tokenizer_config.json", R"({"added_tokens_decoder": {"300": {"content": "<y>", "special": true}}})");
  auto t = Tokenizer::load(dir_.string());
  EXPECT_EQ(t->encode("a<y>"), (std::vector<int32_t>{'a', 300}));
  EXPECT_TRUE(t->is_special(300));
}

// --- The CLI ---------------------------------------------------------------------------

std::string run(const std::string& command) {
  std::string output;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return output;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) output.append(buffer, n);
  ::pclose(pipe);
  return output;
}

TEST(TokenizerCli, TokenizeAndDetokenizeRoundTrip) {
  fs::path dir = fs::temp_directory_path() / ("ellm_tok_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  int passed = 0, cases = 0;
  for (const Vector& v : vectors()) {
    if (v.name != "chat_turn" && v.name != "zwj_family") continue;  // each run loads the tokenizer
    ++cases;
    std::ofstream((dir / "in.txt").string(), std::ios::binary) << v.text;
    std::string bin = ELLM_BIN;
    json ids = json::parse(run(bin + " tokenize --model-path " + kModelDir + " --text-file " + (dir / "in.txt").string()));
    EXPECT_EQ(ids.get<std::vector<int32_t>>(), v.ids) << v.name;
    if (cases == 1) {
      json from_stdin = json::parse(run(bin + " tokenize --model-path " + kModelDir + " < " + (dir / "in.txt").string()));
      EXPECT_EQ(from_stdin, ids) << v.name;
    }

    std::ofstream((dir / "ids.json").string()) << json(v.ids).dump();
    std::string decoded = run(bin + " detokenize --model-path " + kModelDir + " < " + (dir / "ids.json").string());
    std::string skipped = run(bin + " detokenize --skip-special-tokens --model-path " + kModelDir + " < " +
                              (dir / "ids.json").string());
    EXPECT_EQ(decoded, v.decoded) << v.name;
    EXPECT_EQ(skipped, v.decoded_skip_special) << v.name;
    passed += decoded == v.decoded && skipped == v.decoded_skip_special &&
              ids.get<std::vector<int32_t>>() == v.ids;
  }
  std::printf("cli: %d/%d cases round-trip\n", passed, cases);
  EXPECT_EQ(cases, 2);
  fs::remove_all(dir);
}

TEST(TokenizerCli, ErrorsAreOneLineAndExitNonZero) {
  std::string bin = ELLM_BIN;
  std::string out = run("printf 'a\\377b' | " + bin + " tokenize --model-path " + kModelDir + " 2>&1; echo \"rc=$?\"");
  EXPECT_NE(out.find("error: "), std::string::npos) << out;
  EXPECT_NE(out.find("invalid UTF-8"), std::string::npos) << out;
  EXPECT_NE(out.find("rc=1"), std::string::npos) << out;
  out = run("echo '[1, \"x\"]' | " + bin + " detokenize --model-path " + kModelDir + " 2>&1; echo \"rc=$?\"");
  EXPECT_NE(out.find("rc=1"), std::string::npos) << out;
  out = run("echo '[1, 99999999]' | " + bin + " detokenize --model-path " + kModelDir + " 2>&1; echo \"rc=$?\"");
  EXPECT_NE(out.find("not in the vocabulary"), std::string::npos) << out;
  out = run(bin + " tokenize --model-path /nonexistent < /dev/null 2>&1; echo \"rc=$?\"");
  EXPECT_NE(out.find("tokenizer.json"), std::string::npos) << out;
  EXPECT_NE(out.find("rc=1"), std::string::npos) << out;
}

}  // namespace
}  // namespace ellm

namespace ellm {
namespace {

std::vector<std::string> pieces(const std::string& pattern, const std::string& text) {
  UnicodeRegex regex(pattern, "test");
  std::vector<std::string> out;
  regex.split(text, [&](std::string_view piece) { out.emplace_back(piece); });
  return out;
}

// Qwen3.5's pre-tokenizer regex (its tokenizer.json, as docs/models/qwen35.md gives it) adds \p{M} to letter
// runs: a word in Devanagari or Thai stays one piece, where Qwen3's regex splits at every
// combining mark. On text without marks the two agree. The regex comes from tokenizer.json, so
// this checks the engine that runs it.
TEST(Tokenizer, Qwen35RegexKeepsCombiningMarksInLetterRuns) {
  const std::string qwen35 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  const std::string qwen3 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  const std::string namaste = "\xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8\xe0\xa5\x8d\xe0\xa4\xa4\xe0\xa5\x87";  // नमस्ते
  EXPECT_EQ(pieces(qwen35, "say " + namaste + "!"), (std::vector<std::string>{"say", " " + namaste, "!"}));
  EXPECT_GT(pieces(qwen3, "say " + namaste + "!").size(), 3u);
  const std::string thai = "\xe0\xb8\xaa\xe0\xb8\xa7\xe0\xb8\xb1\xe0\xb8\xaa\xe0\xb8\x94\xe0\xb8\xb5";  // สวัสดี
  EXPECT_EQ(pieces(qwen35, thai), std::vector<std::string>{thai});
  for (const char* plain : {"Hello, world! It's 2026.\n\n  x = f(y)", "don't\tSTOP 123"})
    EXPECT_EQ(pieces(qwen35, plain), pieces(qwen3, plain)) << plain;
}

}  // namespace
}  // namespace ellm
