// KILN_CHECK: invariants. A failed check is a bug in kiln, never a user error:
// it prints both sides and aborts. Use Status for anything input can cause.
#pragma once

#include <sstream>
#include <string>

namespace kiln::detail {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const std::string& what);
  [[noreturn]] ~CheckFailure();
  std::ostream& stream() { return os_; }

 private:
  std::ostringstream os_;
};

template <typename A, typename B>
std::string check_op_message(const char* expr, const A& a, const B& b) {
  std::ostringstream os;
  os << expr << " (" << a << " vs " << b << ")";
  return os.str();
}

}  // namespace kiln::detail

#define KILN_CHECK(cond) \
  if (cond) {            \
  } else                 \
    ::kiln::detail::CheckFailure(__FILE__, __LINE__, "check failed: " #cond).stream()

#define KILN_CHECK_OP(op, a, b)                                                             \
  if ((a)op(b)) {                                                                           \
  } else                                                                                    \
    ::kiln::detail::CheckFailure(__FILE__, __LINE__,                                        \
                                 ::kiln::detail::check_op_message("check failed: " #a " " #op \
                                                                  " " #b,                   \
                                                                  (a), (b)))                \
        .stream()

#define KILN_CHECK_EQ(a, b) KILN_CHECK_OP(==, a, b)
#define KILN_CHECK_NE(a, b) KILN_CHECK_OP(!=, a, b)
#define KILN_CHECK_LT(a, b) KILN_CHECK_OP(<, a, b)
#define KILN_CHECK_LE(a, b) KILN_CHECK_OP(<=, a, b)
#define KILN_CHECK_GT(a, b) KILN_CHECK_OP(>, a, b)
#define KILN_CHECK_GE(a, b) KILN_CHECK_OP(>=, a, b)
