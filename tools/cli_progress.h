// Progress of a long command on stderr, for a person at a terminal and for a log file alike: on a terminal one
// line rewritten in place (\r) at every update; otherwise (Slurm, CI, `2> log`) a plain line at the first
// update, then at most one every `log_interval_s`, and at the end. Every line says done/total, the elapsed
// time and, once something is done, an ETA at the rate so far.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace hzp::cli {

inline std::string clock_text(double seconds) {
  const long long s = static_cast<long long>(seconds + 0.5);
  char text[32];
  std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  return text;
}

class ProgressLine {
 public:
  // "plan: estimated %lld/%lld sharding candidates" is `what` = "plan: estimated", `unit` = "sharding candidates".
  ProgressLine(std::string what, std::string unit, double log_interval_s = 10.0)
      : what_(std::move(what)),
        unit_(std::move(unit)),
        tty_(::isatty(STDERR_FILENO) == 1),
        interval_(log_interval_s),
        start_(Clock::now()),
        last_(start_) {}

  void update(long long done, long long total) {
    const auto now = Clock::now();
    const bool due = !printed_ || done == total || seconds(last_, now) >= interval_;
    if (!tty_ && !due) return;
    last_ = now;
    printed_ = true;
    const double elapsed = seconds(start_, now);
    std::string eta;
    if (done > 0 && done < total)
      eta = ", ETA " + clock_text(elapsed / static_cast<double>(done) * static_cast<double>(total - done));
    std::fprintf(stderr, "%s %lld/%lld %s, elapsed %s%s%s", what_.c_str(), done, total, unit_.c_str(),
                 clock_text(elapsed).c_str(), eta.c_str(), tty_ ? "\x1b[K\r" : "\n");
    if (tty_ && done == total) std::fprintf(stderr, "\n");
  }

 private:
  using Clock = std::chrono::steady_clock;
  static double seconds(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  }

  std::string what_, unit_;
  bool tty_;
  double interval_;
  Clock::time_point start_, last_;
  bool printed_ = false;
};

}  // namespace hzp::cli
