#pragma once
// /metrics: the engine's counters and latency histograms plus the server's HTTP counters, in the
// Prometheus text exposition format (names prefixed "ellm:", as vLLM uses "vllm:").
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "engine/engine.h"

namespace ellm {

// Responses by route and status; bumped once per HTTP response.
class HttpCounters {
 public:
  void count(const std::string& route, int status);
  std::map<std::pair<std::string, int>, int64_t> snapshot() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, int64_t> counts_;
};

// Every sample carries model_name and, unless empty, replica (which server of a scaled-out set).
std::string prometheus_text(const EngineMetrics& engine, const HttpCounters& http, const std::string& model_name,
                            const std::string& replica = "");

}  // namespace ellm
