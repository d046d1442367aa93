// The options that describe one LFCE problem, shared by every command that takes one.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "lfce/lfce.h"

namespace lfce::cli {

struct ProblemOptions {
  int64_t tokens = 8192;
  std::string dtype = "bf16";
  std::string mode = "recompute";
  std::string reduction = "mean";
  std::string targets = "i64";
  bool bias = false;
  int64_t chunk = 0;
  int64_t budget_mib = 0;
  int64_t ignore_index = -100;

  // Adds --tokens, --dtype, --mode, --reduction, --targets, --bias, --chunk, --budget-mib.
  void add_to(CLI::App& app);
  lfce_problem problem(int64_t vocab, int64_t hidden) const;
};

// Validators whose messages name the value: "must be >= 1, got 0".
CLI::Validator at_least(int64_t minimum);

// Throws CLI::ValidationError naming the call if an lfce status is not LFCE_OK.
void check(int status, const std::string& what);

// "sm_90a,sm_80" -> {"sm_90a", "sm_80"}
std::vector<std::string> split_list(const std::string& text);

}  // namespace lfce::cli
