// Proof of the job token on every data connection. bpslaunch gives each job a random
// token (BYTEPS_JOB_TOKEN); a worker and a server each show that they know it by a
// keyed hash (HMAC-SHA256) over a fresh nonce of the other side, never the token
// itself, so neither a stranger at the server's port nor one squatting its local
// socket name takes part in the job.
//
//   server -> worker  kChallenge  server nonce
//   worker -> server  kHello      rank, sealing, worker nonce,
//                                 HMAC(token, "worker", server nonce, rank, sealing)
//   server -> worker  kWelcome    HMAC(token, "server", worker nonce, rank, sealing)
//
// With BYTEPS_ENCRYPT (`JobSecret::encrypt`) both sides then seal every frame with
// keys derived from the token and both nonces (crypto.h). A hello whose sealing is
// not the server's is answered with a kError saying so: every node of a job must be
// started alike.
#ifndef TF_BPS_WIRE_AUTH_H_
#define TF_BPS_WIRE_AUTH_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "../common/common.h"
#include "crypto.h"
#include "transport.h"

namespace bps {

// The server's side, on a freshly accepted channel: the worker's rank once it has
// proven the token (within `timeout_ms`), or why it is refused.
Status AuthenticateWorker(Channel& channel, const JobSecret& secret, int num_workers,
                          int timeout_ms, uint32_t* rank);

// The same in two steps, so that one thread can wait for many introductions: the
// challenge goes out at the accept, and once kHelloFrameBytes have arrived (or the
// peer closed), WelcomeWorker reads the hello without waiting, checks the proof and
// answers.
constexpr size_t kHelloFrameBytes = sizeof(FrameHeader) + sizeof(Nonce) + sizeof(Digest);
Status ChallengeWorker(Channel& channel, Nonce* challenge);
Status WelcomeWorker(Channel& channel, const JobSecret& secret, int num_workers,
                     const Nonce& challenge, uint32_t* rank);

// The worker's side, on a freshly opened channel: OK once the server has proven the
// token too.
Status AuthenticateServer(Channel& channel, const JobSecret& secret, uint32_t rank, int timeout_ms);

}  // namespace bps

#endif  // TF_BPS_WIRE_AUTH_H_
