// Builds an error message with << but without iostreams: numbers are formatted with
// std::to_string and snprintf, so no std::locale is touched. The library is loaded into
// processes (Python with NumPy and PyTorch) that may carry another C++ runtime, and iostream
// number formatting goes through locale facets whose ids are runtime-global state.
#pragma once

#include <cstdio>
#include <string>
#include <type_traits>

namespace warpattn::detail {

class Message {
 public:
  Message& operator<<(const char* s) {
    text_ += s;
    return *this;
  }
  Message& operator<<(const std::string& s) {
    text_ += s;
    return *this;
  }
  Message& operator<<(char c) {
    text_ += c;
    return *this;
  }
  template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
  Message& operator<<(T v) {
    text_ += std::to_string(v);
    return *this;
  }
  // Like an ostream's default: %g, so 0.125 -> "0.125", NaN -> "nan", -inf -> "-inf".
  template <class T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  Message& operator<<(T v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", static_cast<double>(v));
    text_ += buf;
    return *this;
  }
  const std::string& str() const { return text_; }

 private:
  std::string text_;
};

// "0x" and the lowercase hexadecimal digits of value.
inline std::string hex(unsigned long long value) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", value);
  return buf;
}

}  // namespace warpattn::detail
