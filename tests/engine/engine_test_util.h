#pragma once
// Reading a request's whole stream in tests.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace ellm {

struct Outcome {
  std::string text;
  std::vector<int32_t> ids;
  std::vector<TokenLogprob> logprobs;
  StreamEvent end;
  int events = 0;
};

// Reads events until the end event; a stream that goes quiet for 60 s fails the test.
inline Outcome collect(const std::shared_ptr<RequestStream>& stream) {
  Outcome out;
  for (;;) {
    std::optional<StreamEvent> event = stream->next(60000);
    if (!event) {
      ADD_FAILURE() << "stream went quiet without an end event";
      return out;
    }
    ++out.events;
    if (event->finished) {
      EXPECT_TRUE(event->text.empty() && event->ids.empty()) << "end events carry no tokens";
      out.end = std::move(*event);
      return out;
    }
    out.text += event->text;
    out.ids.insert(out.ids.end(), event->ids.begin(), event->ids.end());
    out.logprobs.insert(out.logprobs.end(), event->logprobs.begin(), event->logprobs.end());
  }
}

}  // namespace ellm
