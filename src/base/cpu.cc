#include "base/cpu.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <set>
#include <thread>

#include "base/error.h"

namespace ellm {
namespace {

uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

// Linux hands AMX tile state to a process only after it asks for it.
bool request_amx_permission() {
  constexpr long ARCH_REQ_XCOMP_PERM = 0x1023;
  constexpr long XFEATURE_XTILEDATA = 18;
  return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

Isa detect() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(1, 0, &a, &b, &c, &d)) return Isa::scalar;
  bool osxsave = c & (1u << 27), fma = c & (1u << 12), f16c = c & (1u << 29);
  if (!osxsave) return Isa::scalar;
  uint64_t xcr0 = xgetbv0();
  bool ymm_os = (xcr0 & 0x6) == 0x6, zmm_os = (xcr0 & 0xe6) == 0xe6;
  bool amx_os = (xcr0 & 0x60000) == 0x60000;
  __get_cpuid_count(7, 0, &a, &b, &c, &d);
  bool avx2 = b & (1u << 5), avx512f = b & (1u << 16), avx512bw = b & (1u << 30);
  bool avx512vl = b & (1u << 31), avx512dq = b & (1u << 17), avx512vnni = c & (1u << 11);
  bool avx512vbmi = c & (1u << 1);
  bool amx_bf16 = d & (1u << 22), amx_tile = d & (1u << 24);
  unsigned a1, b1, c1, d1;
  __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1);
  bool avx512bf16 = a1 & (1u << 5);
  if (!(avx2 && fma && f16c && ymm_os)) return Isa::scalar;
  // Every CPU with AVX-512-BF16 so far also has AVX-512-VNNI; all but Cooper Lake have VBMI too
  // (Sapphire Rapids, Zen 4, Zen 5), which the FP8 kernels use: Cooper Lake runs the AVX2 tier.
  if (!(avx512f && avx512bw && avx512vl && avx512dq && avx512bf16 && avx512vnni && avx512vbmi &&
        zmm_os))
    return Isa::avx2;
  if (amx_bf16 && amx_tile && amx_os && request_amx_permission()) return Isa::amx;
  return Isa::avx512;
}

std::atomic<int> forced{-1};

bool detect_avx_vnni() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
  return (a & (1u << 4)) && best_isa() >= Isa::avx2;
}

std::atomic<int> avx_vnni_forced{-1};

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
    case Isa::amx: return "amx";
  }
  return "?";
}

Isa parse_isa(const std::string& name) {
  for (Isa i : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::amx})
    if (name == isa_name(i)) return i;
  fail("ELLM_ISA", "unknown instruction set '" + name + "' (expected scalar, avx2, avx512 or amx)");
}

Isa best_isa() {
  static const Isa best = detect();
  return best;
}

void set_active_isa(Isa isa) {
  if (int(isa) > int(best_isa()))
    fail("ELLM_ISA", std::string("this CPU does not support ") + isa_name(isa) +
                         " (best: " + isa_name(best_isa()) + ")");
  forced = int(isa);
}

Isa active_isa() {
  int f = forced.load(std::memory_order_relaxed);
  if (f >= 0) return Isa(f);
  static const Isa from_env = [] {
    const char* env = std::getenv("ELLM_ISA");
    if (!env || !*env) return best_isa();
    Isa want = parse_isa(env);
    if (int(want) > int(best_isa()))
      fail("ELLM_ISA", std::string("this CPU does not support ") + env + " (best: " +
                           isa_name(best_isa()) + ")");
    return want;
  }();
  return from_env;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (int i = 0; i <= int(best_isa()); ++i) out.push_back(Isa(i));
  return out;
}

bool has_avx_vnni() {
  static const bool has = detect_avx_vnni();
  return has;
}

bool avx_vnni_enabled() {
  const int f = avx_vnni_forced.load(std::memory_order_relaxed);
  if (f >= 0) return f;
  static const bool enabled = [] {
    const char* off = std::getenv("ELLM_NO_AVX_VNNI");
    return has_avx_vnni() && !(off && *off && std::string(off) != "0");
  }();
  return enabled;
}

void set_avx_vnni_enabled(bool on) {
  if (on && !has_avx_vnni()) fail("AVX-VNNI", "this CPU does not have AVX-VNNI");
  avx_vnni_forced = on ? 1 : 0;
}

int physical_core_count() {
  // Count distinct (package, core) pairs; hyper-threads share a core and its GEMM units.
  std::set<std::pair<int, int>> cores;
  for (int cpu = 0;; ++cpu) {
    std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::ifstream pkg(base + "physical_package_id"), core(base + "core_id");
    int p, c;
    if (!(pkg >> p) || !(core >> c)) break;
    cores.insert({p, c});
  }
  if (!cores.empty()) return int(cores.size());
  unsigned n = std::thread::hardware_concurrency();
  return n ? int(n) : 1;
}

}  // namespace ellm
