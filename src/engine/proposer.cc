#include "engine/proposer.h"

#include "base/error.h"

namespace ellm {

const char* proposer_name(Proposer proposer) {
  switch (proposer) {
    case Proposer::ngram: return "ngram";
    case Proposer::mtp: return "mtp";
    case Proposer::draft: return "draft";
    default: return "none";
  }
}

Proposer parse_proposer(const std::string& name, const std::string& where) {
  if (name == "none") return Proposer::none;
  if (name == "ngram") return Proposer::ngram;
  if (name == "mtp") return Proposer::mtp;
  if (name == "draft" || name.rfind("draft:", 0) == 0) return Proposer::draft;
  fail(where, "unknown speculative method '" + name + "' (expected ngram, mtp, draft:PATH or none)");
}

}  // namespace ellm
