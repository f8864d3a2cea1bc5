#pragma once
// What --activations auto resolves to: the inputs INT4 products run on with this CPU's tier.
#include "model/model.h"

namespace ellm {

struct Int4ActivationChoice {
  ActivationDtype dtype = ActivationDtype::bf16;
  bool measured = false;         // timed on this CPU (AVX2 without VNNI), not given by the tier
  double decode_speedup = 0;     // int8 inputs' speed over BF16 inputs for one row (measured)
  double prefill_speedup = 0;    // the same for a tile of kPrefillRows rows
};

// VNNI tiers (AVX-512, AMX, AVX2 with AVX-VNNI): int8, one vpdpbusd per 4 inputs. Scalar: BF16,
// the reference path. AVX2 without VNNI (AMD Zen 2/3, older Xeons): int8 inputs go through
// vpmaddubsw and vpmaddwd, and whether that beats widening the codes to FP32 depends on the
// core, so both run on a 2048 x 1024 INT4 matrix, one row and a tile of rows, alternating, and
// the faster wins (faster_int4_activations). Timed once per process and tier (under 0.1 s), so
// every model a process loads makes the same choice.
Int4ActivationChoice choose_int4_activations();

// int8 when it is faster for one row (decode, where the weights' bytes rule) and not more than
// 10% slower for a tile of rows (prefill).
ActivationDtype faster_int4_activations(double decode_speedup, double prefill_speedup);

}  // namespace ellm
