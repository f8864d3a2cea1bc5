#include "engine/prompt_lookup.h"

namespace ellm {

int propose_ngram(std::span<const int32_t> sequence, int k, int32_t* out) {
  const int64_t n = int64_t(sequence.size());
  if (k <= 0 || n < kMinNgram + 1) return 0;
  const int32_t* s = sequence.data();
  // For each earlier end e (the n-gram s[e - len, e) followed by s[e]), the length of the
  // match with the sequence's end; the longest wins, the latest among equals.
  int64_t best_end = -1, best_len = 0;
  for (int64_t e = n - 1; e >= kMinNgram; --e) {
    int64_t len = 0;
    while (len < kMaxNgram && len < e && s[e - 1 - len] == s[n - 1 - len]) ++len;
    if (len > best_len) {
      best_len = len;
      best_end = e;
      if (len == kMaxNgram) break;
    }
  }
  if (best_len < kMinNgram) return 0;
  // What followed the match; where that runs into the end, the sequence repeats itself with
  // period n - best_end (a loop, or a match overlapping the end), and so the proposal.
  for (int j = 0; j < k; ++j) out[j] = s[best_end + j % (n - best_end)];
  return k;
}

}  // namespace ellm
