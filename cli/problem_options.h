// The options that describe one LFCE problem, shared by every command that takes one.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/kernel_spec.h"
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
  // The loss options, one member each from runtime/problem_options.def.
#define LFCE_PROBLEM_FLOAT(member, c_field, option, none, ...) float member = none;
#define LFCE_PROBLEM_FLAG(member, ...) bool member = false;
#include "runtime/problem_options.def"
  int64_t sequence_length = 0;
  std::vector<std::string> outputs;  // each a comma-separated list of "entropy", "logprob", "predicted"
  int64_t ignore_index = -100;

  // Adds --tokens, --dtype, --mode, --reduction, --targets, --bias, --chunk, --budget-mib, an option
  // for each line of runtime/problem_options.def (--softcap, ..., --token-scaling), --sequence-length
  // and --outputs.
  void add_to(CLI::App& app);
  lfce_problem problem(int64_t vocab, int64_t hidden) const;
};

// The largest --budget-mib whose bytes fit an int64_t.
inline constexpr int64_t kMaxBudgetMib = INT64_MAX >> 20;
// The largest budget lfce_tune takes (about 1900 years).
inline constexpr double kMaxBudgetMinutes = 1e9;

// Validators whose messages name the value: "must be an integer >= 1, got '0'".
CLI::Validator at_least(int64_t minimum);
CLI::Validator integer_in(int64_t minimum, int64_t maximum);
// Decimal numbers only (no hexadecimal, nan or inf), the text named in the message.
CLI::Validator finite_at_least(double minimum);
CLI::Validator finite_in(double minimum, double maximum);
// A decimal number that is a float: not beyond float's range, and not rounding to 0 unless it
// is 0. `range` (the library's for the option) is quoted in the message.
CLI::Validator float_number(const std::string& range);
CLI::Validator non_empty();
CLI::Validator comma_list();  // "a,b": no empty item, not empty
CLI::Validator comma_list_of(const std::vector<std::string>& names);  // and each item one of `names`

// An lfce status that is not LFCE_OK becomes a usage error naming `option` (for
// LFCE_ERR_INVALID_ARGUMENT, where the value came from that option) or a Failure.
void check(int status, const std::string& option);

// "sm_90a,sm_80" -> {"sm_90a", "sm_80"}
std::vector<std::string> split_list(const std::string& text);

}  // namespace lfce::cli
