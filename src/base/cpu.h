#pragma once
// Instruction-set tiers, detected at run time. ELLM_ISA=scalar|avx2|avx512|amx forces a lower
// tier (a higher one than the machine has is an error).
#include <string>
#include <vector>

namespace ellm {

enum class Isa { scalar = 0, avx2 = 1, avx512 = 2, amx = 3 };

const char* isa_name(Isa isa);
Isa parse_isa(const std::string& name);  // throws Error on an unknown name

Isa best_isa();                 // the best tier this CPU (and OS) supports
Isa active_isa();               // best_isa(), lowered by ELLM_ISA or set_active_isa()
void set_active_isa(Isa isa);   // throws Error if the CPU lacks it; for tests and benchmarks
std::vector<Isa> supported_isas();  // every tier up to best_isa(), lowest first

// AVX-VNNI (vpdpbusd on 256-bit vectors without AVX-512): the AVX2 tier's int8 products use it
// where the CPU has it, unless turned off (ELLM_NO_AVX_VNNI=1, or set_avx_vnni_enabled(false):
// tests run both ways).
bool has_avx_vnni();
bool avx_vnni_enabled();
void set_avx_vnni_enabled(bool on);  // throws Error when turning it on without the CPU feature

int physical_core_count();

}  // namespace ellm
