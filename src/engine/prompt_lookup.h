#pragma once
// Prompt lookup, the proposer of speculative decoding that needs no model (Proposer::ngram):
// what followed an earlier occurrence of the sequence's last tokens is likely to follow again
// (code edits, quoted documents, repeated structure).
#include <cstdint>
#include <span>

namespace ellm {

// The most recent earlier occurrence of the longest n-gram (kMinNgram .. kMaxNgram tokens)
// that ends `sequence`; the k tokens that followed it go to out (where they run into the end,
// the sequence is taken to repeat with that period). Returns k, or 0 when nothing matches.
constexpr int kMinNgram = 2, kMaxNgram = 8;
int propose_ngram(std::span<const int32_t> sequence, int k, int32_t* out);

}  // namespace ellm
