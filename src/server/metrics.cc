#include "server/metrics.h"

#include <cstdio>
#include <sstream>

namespace ellm {

void HttpCounters::count(const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(mutex_);
  counts_[{route, status}]++;
}

std::map<std::pair<std::string, int>, int64_t> HttpCounters::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counts_;
}

namespace {

std::string number(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

// Label values escape backslash, quote and newline.
std::string escape_label(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') { out += "\\n"; continue; }
    out += c;
  }
  return out;
}

}  // namespace

std::string prometheus_text(const EngineMetrics& m, const HttpCounters& http, const std::string& model_name,
                            const std::string& replica) {
  std::ostringstream out;
  const std::string replica_label = replica.empty() ? "" : ",replica=\"" + escape_label(replica) + "\"";
  const std::string label = "model_name=\"" + escape_label(model_name) + "\"" + replica_label;
  auto scalar = [&](const char* name, const char* type, const char* help, double value) {
    out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n'
        << name << '{' << label << "} " << number(value) << '\n';
  };
  auto histogram = [&](const char* name, const char* help, const EngineMetrics::Histogram& h) {
    out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " histogram\n";
    for (size_t i = 0; i < h.counts.size(); i++) {
      std::string le = i < h.bounds.size() ? number(h.bounds[i]) : "+Inf";
      out << name << "_bucket{" << label << ",le=\"" << le << "\"} " << h.counts[i] << '\n';
    }
    if (h.counts.size() == h.bounds.size())  // the engine left out the +Inf bucket
      out << name << "_bucket{" << label << ",le=\"+Inf\"} " << h.count << '\n';
    out << name << "_sum{" << label << "} " << number(h.sum) << '\n'
        << name << "_count{" << label << "} " << h.count << '\n';
  };

  scalar("ellm:num_requests_running", "gauge", "Requests holding a slot.", m.requests_running);
  scalar("ellm:num_requests_waiting", "gauge", "Requests queued for a slot.", m.requests_waiting);
  scalar("ellm:prompt_tokens_total", "counter", "Prompt tokens received.", m.prompt_tokens_total);
  scalar("ellm:generation_tokens_total", "counter", "Tokens generated.", m.generation_tokens_total);
  scalar("ellm:session_cache_hit_tokens_total", "counter", "Prompt tokens served from the session cache instead of prefilled.", m.cached_tokens_total);
  scalar("ellm:session_cache_recomputed_tokens_total", "counter", "Prompt tokens held in a session but prefilled again (a hybrid model resumes only at a snapshot of its recurrent state).", m.recomputed_tokens_total);
  scalar("ellm:images_total", "counter", "Images in admitted requests.", m.images_total);
  scalar("ellm:images_encoded_total", "counter", "Images the vision tower encoded (the others' tokens came from the session cache or the image cache).", m.images_encoded_total);
  scalar("ellm:image_cache_hits_total", "counter", "Images whose tower rows came from the image cache (--image-cache) instead of the tower.", m.image_cache_hits_total);
  scalar("ellm:image_cache_bytes", "gauge", "Bytes of tower rows the image cache holds.", int64_t(m.image_cache_bytes));
  scalar("ellm:requests_finished_total", "counter", "Requests finished (any reason).", m.requests_finished_total);
  scalar("ellm:kv_cache_resident_bytes", "gauge", "KV cache memory committed in RAM.", static_cast<double>(m.kv_resident_bytes));
  scalar("ellm:kv_cache_budget_bytes", "gauge", "KV cache memory budget (--kv-memory).", static_cast<double>(m.kv_budget_bytes));
  out << "# HELP ellm:kv_cache_bytes_per_token KV cache bytes per position of a slot, all layers, in its dtype (--kv-cache-dtype).\n"
      << "# TYPE ellm:kv_cache_bytes_per_token gauge\n"
      << "ellm:kv_cache_bytes_per_token{" << label << ",dtype=\"" << m.kv_dtype << "\"} "
      << number(double(m.kv_bytes_per_token)) << '\n';
  if (const MappedTableStatus& t = m.mapped_table; t.bytes > 0) {
    scalar("ellm:mapped_table_bytes", "gauge", "Size of the table read in place from the checkpoint (the n-gram table).", double(t.bytes));
    scalar("ellm:mapped_table_resident_bytes", "gauge", "Its bytes resident in RAM (page cache, or pinned by --mlock-table).", double(t.resident_bytes));
    scalar("ellm:mapped_table_gathered_tokens_total", "counter", "Tokens whose table rows were gathered.", double(t.gathered_tokens));
    out << "# HELP ellm:mapped_table_page_faults_total Page faults taken while gathering table rows (major: read from disk).\n"
        << "# TYPE ellm:mapped_table_page_faults_total counter\n"
        << "ellm:mapped_table_page_faults_total{" << label << ",kind=\"major\"} " << number(double(t.major_faults)) << '\n'
        << "ellm:mapped_table_page_faults_total{" << label << ",kind=\"minor\"} " << number(double(t.minor_faults)) << '\n';
    scalar("ellm:mapped_table_page_faults_per_token", "gauge", "Page faults per gathered token since start (major and minor).",
           t.gathered_tokens ? double(t.major_faults + t.minor_faults) / double(t.gathered_tokens) : 0.0);
  }
  const std::pair<const char*, const SessionTierMetrics*> tiers[] = {
      {"hot", &m.sessions.hot}, {"ram", &m.sessions.ram}, {"disk", &m.sessions.disk}};
  auto per_tier = [&](const char* name, const char* type, const char* help, auto field) {
    out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
    for (const auto& [tier, t] : tiers)
      out << name << '{' << label << ",tier=\"" << tier << "\"} " << number(double(field(*t))) << '\n';
  };
  using T = SessionTierMetrics;
  per_tier("ellm:session_hits_total", "counter", "Requests whose prompt prefix was restored from this tier (hot: a slot).", [](const T& t) { return t.hits; });
  per_tier("ellm:session_hit_tokens_total", "counter", "Prompt tokens served from this tier.", [](const T& t) { return t.tokens; });
  per_tier("ellm:session_restored_bytes_total", "counter", "KV and snapshot bytes copied from this tier into slots.", [](const T& t) { return t.bytes_in; });
  per_tier("ellm:session_stored_bytes_total", "counter", "KV and snapshot bytes copied into this tier.", [](const T& t) { return t.bytes_out; });
  per_tier("ellm:session_restore_seconds_total", "counter", "Seconds spent restoring from this tier.", [](const T& t) { return t.restore_seconds; });
  per_tier("ellm:session_evictions_total", "counter", "Sessions this tier's budget pushed out (to the next tier or dropped).", [](const T& t) { return t.evictions; });
  per_tier("ellm:session_failures_total", "counter", "Failed session writes or restores (the session is dropped; serving goes on).", [](const T& t) { return t.failures; });
  per_tier("ellm:sessions", "gauge", "Sessions held in this tier.", [](const T& t) { return t.sessions; });
  per_tier("ellm:session_bytes", "gauge", "KV and snapshot bytes held in this tier.", [](const T& t) { return t.bytes; });
  per_tier("ellm:session_snapshots_taken_total", "counter", "Snapshots of a hybrid model's recurrent state taken into this tier (hot: by prefill passes).", [](const T& t) { return t.snapshots_taken; });
  per_tier("ellm:session_snapshot_bytes_taken_total", "counter", "Bytes of the snapshots taken into this tier.", [](const T& t) { return t.snapshot_bytes_taken; });
  per_tier("ellm:session_snapshots_restored_total", "counter", "Snapshots copied from this tier into slots.", [](const T& t) { return t.snapshots_restored; });
  per_tier("ellm:session_snapshot_bytes_restored_total", "counter", "Bytes of the snapshots restored from this tier.", [](const T& t) { return t.snapshot_bytes_restored; });
  per_tier("ellm:session_snapshots_evicted_total", "counter", "Snapshots this tier let go (to the next tier, or dropped).", [](const T& t) { return t.snapshots_evicted; });
  per_tier("ellm:session_snapshot_bytes_evicted_total", "counter", "Bytes of the snapshots this tier let go.", [](const T& t) { return t.snapshot_bytes_evicted; });
  per_tier("ellm:session_snapshots", "gauge", "Snapshots held in this tier.", [](const T& t) { return t.snapshots; });
  auto per_proposer = [&](const char* name, const char* help, auto field) {
    out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " counter\n";
    for (int p = int(Proposer::ngram); p < int(Proposer::count); ++p)
      out << name << '{' << label << ",proposer=\"" << proposer_name(Proposer(p)) << "\"} "
          << number(double(field(m.speculative[p]))) << '\n';
  };
  using S = EngineMetrics::Speculative;
  per_proposer("ellm:spec_decode_num_drafts_total", "Speculative decoding: groups of proposed tokens checked.", [](const S& s) { return s.checks; });
  per_proposer("ellm:spec_decode_num_draft_tokens_total", "Speculative decoding: tokens proposed.", [](const S& s) { return s.proposed; });
  per_proposer("ellm:spec_decode_num_accepted_tokens_total", "Speculative decoding: proposed tokens kept.", [](const S& s) { return s.accepted; });
  per_proposer("ellm:spec_decode_propose_seconds_total", "Speculative decoding: seconds spent proposing (draft model or MTP passes, prompt lookup).", [](const S& s) { return s.propose_seconds; });
  histogram("ellm:time_to_first_token_seconds", "Time from arrival to the first generated token.", m.time_to_first_token);
  histogram("ellm:inter_token_latency_seconds", "Time between consecutive generated tokens.", m.inter_token_latency);
  histogram("ellm:e2e_request_latency_seconds", "Time from arrival to the last token.", m.e2e_latency);

  out << "# HELP ellm:http_responses_total HTTP responses by route and status.\n"
      << "# TYPE ellm:http_responses_total counter\n";
  for (const auto& [key, count] : http.snapshot())
    out << "ellm:http_responses_total{route=\"" << escape_label(key.first) << "\",status=\"" << key.second << '"' << replica_label << "} " << count << '\n';

  // Requests per API, whatever their status: the generation routes' responses summed.
  static const std::pair<const char*, const char*> kApis[] = {
      {"chat_completions", "/v1/chat/completions"}, {"completions", "/v1/completions"},
      {"messages", "/v1/messages"}, {"messages_count_tokens", "/v1/messages/count_tokens"},
      {"responses", "/v1/responses"}};
  out << "# HELP ellm:requests_total Requests by API (any status).\n# TYPE ellm:requests_total counter\n";
  const auto responses = http.snapshot();
  for (const auto& [api, route] : kApis) {
    int64_t total = 0;
    for (const auto& [key, count] : responses)
      if (key.first == route) total += count;
    out << "ellm:requests_total{" << label << ",api=\"" << api << "\"} " << total << '\n';
  }
  return out.str();
}

}  // namespace ellm
