#include "cli/problem_options.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <sstream>

#include "cli/commands.h"

namespace lfce::cli {
namespace {

const std::map<std::string, int32_t> kDtypes = {
    {"bf16", LFCE_DTYPE_BF16}, {"fp16", LFCE_DTYPE_FP16}, {"fp32", LFCE_DTYPE_FP32}};
const std::map<std::string, int32_t> kModes = {{"recompute", LFCE_MODE_RECOMPUTE}, {"eager", LFCE_MODE_EAGER}};
const std::map<std::string, int32_t> kReductions = {
    {"mean", LFCE_REDUCTION_MEAN}, {"sum", LFCE_REDUCTION_SUM}, {"none", LFCE_REDUCTION_NONE}};
const std::map<std::string, int32_t> kTargets = {{"i64", LFCE_INDEX_INT64}, {"i32", LFCE_INDEX_INT32}};

template <typename T>
std::vector<std::string> keys(const std::map<std::string, T>& m) {
  std::vector<std::string> out;
  for (const auto& [k, v] : m) out.push_back(k);
  return out;
}

// A decimal number as people write one: an optional sign, digits with an optional point, an
// optional exponent. Not hexadecimal, inf or nan (which strtod also reads), nor padded.
bool is_decimal(const std::string& text) {
  size_t i = 0, digits = 0;
  const auto digit = [&] { return i < text.size() && text[i] >= '0' && text[i] <= '9'; };
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
  for (; digit(); ++i) ++digits;
  if (i < text.size() && text[i] == '.')
    for (++i; digit(); ++i) ++digits;
  if (digits == 0) return false;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    if (!digit()) return false;
    while (digit()) ++i;
  }
  return i == text.size();
}

}  // namespace

CLI::Validator integer_in(int64_t minimum, int64_t maximum) {
  const bool bounded = maximum != std::numeric_limits<int64_t>::max();
  const std::string range = bounded ? "in [" + std::to_string(minimum) + ", " + std::to_string(maximum) + "]"
                                    : ">= " + std::to_string(minimum);
  return CLI::Validator(
      [minimum, maximum, range](std::string& text) -> std::string {
        try {
          size_t end = 0;
          long long value = std::stoll(text, &end);
          if (end == text.size() && value >= minimum && value <= maximum) return "";
        } catch (const std::exception&) {  // not a number, or out of int64's range
        }
        return "must be an integer " + range + ", got '" + text + "'";
      },
      bounded ? "INT" : "INT>=" + std::to_string(minimum));
}

CLI::Validator at_least(int64_t minimum) { return integer_in(minimum, std::numeric_limits<int64_t>::max()); }

CLI::Validator finite_in(double minimum, double maximum) {
  // Whole bounds as integers ("1000000000", not "1e+09").
  const auto text_of = [](double bound) {
    std::ostringstream out;
    if (bound == std::floor(bound) && std::fabs(bound) < 1e15)
      out << static_cast<long long>(bound);
    else
      out << bound;
    return out.str();
  };
  const std::string range = maximum < std::numeric_limits<double>::max()
                                ? "in [" + text_of(minimum) + ", " + text_of(maximum) + "]"
                                : ">= " + text_of(minimum);
  return CLI::Validator(
      [minimum, maximum, range](std::string& text) -> std::string {
        if (is_decimal(text)) {
          const double value = std::strtod(text.c_str(), nullptr);
          if (std::isfinite(value) && value >= minimum && value <= maximum) return "";
        }
        return "must be a decimal number " + range + ", got '" + text + "'";
      },
      "NUMBER");
}

CLI::Validator finite_at_least(double minimum) { return finite_in(minimum, std::numeric_limits<double>::max()); }

CLI::Validator float_number(const std::string& range) {
  return CLI::Validator(
      [range](std::string& text) -> std::string {
        if (!is_decimal(text)) return "must be a decimal number (" + range + "), got '" + text + "'";
        const float value = std::strtof(text.c_str(), nullptr);
        if (!std::isfinite(value))
          return "'" + text + "' is beyond a float's range (magnitudes up to 3.4e38); " + range;
        // Digits other than 0 before the exponent: the text names a non-zero value.
        const bool nonzero = text.substr(0, text.find_first_of("eE")).find_first_of("123456789") != std::string::npos;
        // A subnormal float (below 1.18e-38, FLT_MIN) is 0 or inexact in the kernels' math: the
        // library refuses it (lfce_problem), so the command line does too, before any work.
        if (nonzero && std::fabs(value) < std::numeric_limits<float>::min())
          return "'" + text + "' is below a float's smallest normal number, 1.18e-38 (it would be 0 or subnormal); " +
                 range;
        return "";
      },
      "NUMBER");
}

CLI::Validator non_empty() {
  return CLI::Validator([](std::string& text) -> std::string { return text.empty() ? "must not be empty" : ""; },
                        "TEXT");
}

CLI::Validator comma_list_of(const std::vector<std::string>& names) {
  std::string choices;
  for (const std::string& name : names) choices += (choices.empty() ? "" : ", ") + name;
  return CLI::Validator(
      [names, choices](std::string& text) -> std::string {
        std::vector<std::string> items;
        std::stringstream in(text);
        for (std::string item; std::getline(in, item, ',');) items.push_back(item);
        if (text.empty() || text.back() == ',') items.push_back("");
        for (const std::string& item : items) {
          if (item.empty())
            return "'" + text + "' has an empty item; give a comma-separated list of " + choices;
          if (std::find(names.begin(), names.end(), item) == names.end())
            return "'" + item + "' is not one of " + choices;
        }
        return "";
      },
      "LIST");
}

CLI::Validator comma_list() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text.empty()) return "names no target; give a comma-separated list such as sm_90a,sm_80";
        if (text.front() == ',' || text.back() == ',' || text.find(",,") != std::string::npos)
          return "'" + text + "' has an empty item; give a comma-separated list such as sm_90a,sm_80";
        return "";
      },
      "LIST");
}

void ProblemOptions::add_to(CLI::App& app) {
  app.add_option("--tokens,-n", tokens, "tokens N (run-time size; picks the chunk width)")
      ->check(at_least(1))
      ->capture_default_str();
  app.add_option("--dtype", dtype, "dtype of hidden, weight and gradients")
      ->check(CLI::IsMember(keys(kDtypes)))
      ->capture_default_str();
  app.add_option("--mode", mode, "recompute or eager")->check(CLI::IsMember(keys(kModes)))->capture_default_str();
  app.add_option("--reduction", reduction, "mean, sum or none")
      ->check(CLI::IsMember(keys(kReductions)))
      ->capture_default_str();
  app.add_option("--targets", targets, "index dtype of the targets")
      ->check(CLI::IsMember(keys(kTargets)))
      ->capture_default_str();
  app.add_flag("--bias", bias, "the layer has a bias");
  app.add_option("--chunk", chunk, "vocabulary chunk of the backward (0: from the budget)")
      ->check(at_least(0))
      ->capture_default_str();
  app.add_option("--budget-mib", budget_mib, "backward workspace budget in MiB (0: 256)")
      ->check(integer_in(0, kMaxBudgetMib))
      ->capture_default_str();
  // The loss options. A float's text must name a float (not one that rounds to 0 or overflows);
  // the range is the library's to check (lfce_check_problem names the value), and is quoted in
  // the messages.
#define LFCE_PROBLEM_FLOAT(member, c_field, option, none, lowest, highest, range, help) \
  app.add_option(option, member, help)                                                  \
      ->check(float_number("lfce_problem." #c_field ": " range))                        \
      ->capture_default_str();
#define LFCE_PROBLEM_FLAG(member, c_field, option, spec_member, help) app.add_flag(option, member, help);
#include "runtime/problem_options.def"
  // Its fit to --tokens is the library's to check (tokens a multiple of it).
  app.add_option("--sequence-length", sequence_length,
                 "causal shift over sequences of this many tokens: position t scored against target t+1 "
                 "(Cut Cross-Entropy's shift; 0: none)")
      ->check(at_least(0))
      ->capture_default_str();
  app.add_option("--outputs", outputs, "extra per-token outputs of the forward, comma-separated: entropy, logprob, predicted")
      ->check(comma_list_of({"entropy", "logprob", "predicted"}));
}

lfce_problem ProblemOptions::problem(int64_t vocab, int64_t hidden) const {
  lfce_problem p{};
  p.tokens = tokens;
  p.hidden = hidden;
  p.vocab = vocab;
  p.dtype = kDtypes.at(dtype);
  p.target_dtype = kTargets.at(targets);
  p.has_bias = bias ? 1 : 0;
  p.reduction = kReductions.at(reduction);
  p.mode = kModes.at(mode);
  p.ignore_index = ignore_index;
  p.chunk_size = chunk;
  p.workspace_budget = budget_mib << 20;
#define LFCE_PROBLEM_FLOAT(member, c_field, ...) p.c_field = member;
#define LFCE_PROBLEM_FLAG(member, c_field, ...) p.c_field = member ? 1 : 0;
#include "runtime/problem_options.def"
  p.sequence_length = sequence_length;
  for (const std::string& list : outputs)
    for (const std::string& name : split_list(list))
      p.outputs |= name == "entropy" ? LFCE_OUTPUT_ENTROPY : name == "logprob" ? LFCE_OUTPUT_LOGPROB : LFCE_OUTPUT_PREDICTED;
  return p;
}

void check(int status, const std::string& option) {
  switch (status) {
    case LFCE_OK:
      return;
    case LFCE_ERR_INVALID_ARGUMENT:
    case LFCE_ERR_OUT_OF_RESOURCES:  // the message names the limit to give or the problem to shrink
      throw CLI::ValidationError(option, lfce_last_error());
    case LFCE_ERR_COMPILE:
    case LFCE_ERR_CUDA:
    case LFCE_ERR_IO:
      throw Failure(lfce_last_error());
    default:
      throw Failure(lfce_last_error(), kExitInternal);  // the message says "internal error"
  }
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace lfce::cli
