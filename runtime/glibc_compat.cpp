// LLVMSupport calls arc4random, which glibc gained only in 2.36. Defining it here keeps
// liblfce.so loadable on older glibc; the version script keeps the symbol private.
#include <sys/random.h>

#include <cstdint>

extern "C" uint32_t arc4random(void) {
  uint32_t value = 0;
  while (getrandom(&value, sizeof value, 0) != static_cast<ssize_t>(sizeof value)) {
  }
  return value;
}
