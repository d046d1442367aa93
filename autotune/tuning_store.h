// Writing tuning results: the autotuner is the only producer of the files that the runtime
// reads (runtime/tuning_files.h: the key, the entry, the format and the reader). A
// TuningStore is the runtime's reader of one cache directory plus save().
#pragma once

#include <string>

#include "runtime/tuning_files.h"

namespace lfce::autotune {

class TuningStore : public runtime::TuningFiles {
 public:
  // An empty cache_dir (default_cache_dir() found none) stores nothing and finds nothing.
  explicit TuningStore(const std::string& cache_dir) : TuningFiles(cache_dir) {}

  // Writes atomically (temp file in the same directory, fsync, rename): readers see the old
  // entry or the new one, never a part. Throws std::runtime_error naming the path.
  void save(const runtime::TuningEntry& entry) const;
};

}  // namespace lfce::autotune
