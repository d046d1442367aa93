// A golden record on disk: '#' lines are its header (what it holds and how to regenerate it),
// the other lines its records. LFCE_GOLDEN_UPDATE=1 makes a golden test write what it computed
// instead of comparing.
#pragma once

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace lfce::golden {

inline bool update_requested() {
  const char* v = std::getenv("LFCE_GOLDEN_UPDATE");
  return v && std::strcmp(v, "1") == 0;
}

// The records of `path` (every line but the '#' header lines); empty if there is no such file.
inline std::vector<std::string> read_records(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (line.empty() || line[0] != '#') out.push_back(line);
  return out;
}

// Writes `header` (each line prefixed "# ") and `records`; false if the file cannot be written.
inline bool write_records(const std::string& path, const std::string& header, const std::vector<std::string>& records) {
  std::ofstream out(path, std::ios::trunc);
  std::istringstream lines(header);
  for (std::string line; std::getline(lines, line);) out << (line.empty() ? "#" : "# " + line) << '\n';
  for (const std::string& r : records) out << r << '\n';
  out.close();
  return static_cast<bool>(out);
}

}  // namespace lfce::golden
