// A minimal test harness: each test is a function registered by TEST(name); CHECK records a
// failure and goes on, REQUIRE stops the test, SKIP ends it as skipped with a printed reason.
// main() runs every test (or those whose name contains argv[1]) and ends with the line
// "N passed, N failed, N skipped"; the exit code is 1 if any test failed, 77 if every test
// skipped, else 0.
#pragma once

#include <cstdio>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace harness {

struct Skip {
  std::string reason;
};
struct Abort {};

struct Test {
  const char* name;
  void (*fn)();
};
inline std::vector<Test>& registry() {
  static std::vector<Test> tests;
  return tests;
}
inline int& failures_in_test() {
  static int n = 0;
  return n;
}
struct Register {
  Register(const char* name, void (*fn)()) { registry().push_back({name, fn}); }
};

// Streams a failure message; prints it when destroyed.
class Failure {
 public:
  Failure(const char* file, int line, const char* expr, bool fatal = false) : fatal_(fatal) {
    os_ << file << ":" << line << ": " << (fatal ? "REQUIRE" : "CHECK") << " failed: " << expr;
    ++failures_in_test();
  }
  // A fatal failure ends the test by throwing from here, at the end of the statement.
  ~Failure() noexcept(false) {
    std::printf("    %s\n", os_.str().c_str());
    if (fatal_) throw Abort{};
  }
  template <class T>
  Failure& operator<<(const T& v) {
    os_ << (first_ ? " -- " : "") << v;
    first_ = false;
    return *this;
  }

 private:
  std::ostringstream os_;
  bool first_ = true;
  bool fatal_;
};

inline constexpr int kAllSkipped = 77;

inline int run_all(int argc, char** argv) {
  const char* filter = argc > 1 ? argv[1] : nullptr;
  int passed = 0, failed = 0, skipped = 0;
  for (const Test& t : registry()) {
    if (filter && !std::strstr(t.name, filter)) continue;
    failures_in_test() = 0;
    std::printf("[ RUN      ] %s\n", t.name);
    std::fflush(stdout);
    bool skip = false;
    std::string why;
    try {
      t.fn();
    } catch (const Skip& s) {
      skip = true;
      why = s.reason;
    } catch (const Abort&) {
    } catch (const std::exception& e) {
      std::printf("    unexpected exception: %s\n", e.what());
      ++failures_in_test();
    }
    if (failures_in_test() > 0) {
      ++failed;
      std::printf("[  FAILED  ] %s\n", t.name);
    } else if (skip) {
      ++skipped;
      std::printf("[  SKIPPED ] %s: %s\n", t.name, why.c_str());
    } else {
      ++passed;
      std::printf("[       OK ] %s\n", t.name);
    }
    std::fflush(stdout);
  }
  std::printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
  // 77 when every test skipped, so CTest reports the suite as skipped (SKIP_RETURN_CODE), not
  // as passed.
  return failed ? 1 : (passed == 0 && skipped > 0 ? kAllSkipped : 0);
}

}  // namespace harness

#define HARNESS_CAT2(a, b) a##b
#define HARNESS_CAT(a, b) HARNESS_CAT2(a, b)
#define TEST(name)                                                      \
  static void name();                                                   \
  static harness::Register HARNESS_CAT(register_, name)(#name, &name); \
  static void name()
// Records a failure and continues; extra context can be streamed: CHECK(x < 1) << "x=" << x;
#define CHECK(cond) \
  if (cond) {       \
  } else            \
    harness::Failure(__FILE__, __LINE__, #cond)
// Records a failure and ends the test; context can be streamed as for CHECK.
#define REQUIRE(cond) \
  if (cond) {         \
  } else              \
    harness::Failure(__FILE__, __LINE__, #cond, true)
#define SKIP(reason) throw harness::Skip{reason}
#define HARNESS_MAIN() \
  int main(int argc, char** argv) { return harness::run_all(argc, argv); }
