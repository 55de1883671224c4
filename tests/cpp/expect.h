// The check every C++ unit test file uses: a failed EXPECT is counted and reported,
// and the test binary exits non-zero at the end (core_unit_test.cc's main).
#ifndef TF_BPS_TESTS_CPP_EXPECT_H_
#define TF_BPS_TESTS_CPP_EXPECT_H_

#include <iostream>

namespace bps {

inline int failures = 0;

#define EXPECT(condition)                                                        \
  do {                                                                           \
    if (!(condition)) {                                                          \
      ++::bps::failures;                                                         \
      std::cerr << __FILE__ << ":" << __LINE__ << ": expected " #condition "\n"; \
    }                                                                            \
  } while (0)

// Defined in their own files.
void TestSharedSlots();
void TestDeviceStaging();
void TestRounds();
void TestWaitingRoom();
void TestSealedFrames();
void TestTimelineWindow();
void TestTimelineRecordings();
void TestTimelineSwitchesUnderLoad();
void TestCompression();
void BenchmarkCompressors();  // Prints; checks nothing.

}  // namespace bps

#endif  // TF_BPS_TESTS_CPP_EXPECT_H_
