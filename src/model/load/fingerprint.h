#pragma once
// A model's identity for stored sessions: KV written by one model must never be restored into
// another, and replicas that load the same folder must agree on it.
#include <cstdint>
#include <string>

namespace ellm {

// Hashes config.json, and for each *.safetensors file its size, its header (every tensor's
// name, dtype, shape and offsets) and 16 samples of 64 KiB spread over its data: a few MiB
// read whatever the model's size, yet two random-weight models of one shape differ.
uint64_t model_fingerprint(const std::string& model_dir);

}  // namespace ellm
