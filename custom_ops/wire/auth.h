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
// The worker proves itself first, and until it has, the server says nothing but its
// challenge and reads nothing but a hello of the exact size: no refusal text, no rank
// range and no setting of the job reaches a stranger. A worker that proved the token
// but seals differently (BYTEPS_ENCRYPT) is told so in a kError: every node of a job
// must be started alike. With BYTEPS_ENCRYPT both sides then seal every frame with
// keys derived from the token and both nonces (crypto.h).
//
// The handshake runs on the bare Connection: only once both sides have proven the
// token does it become a Channel (transport.h), shared memory and all.
#ifndef TF_BPS_WIRE_AUTH_H_
#define TF_BPS_WIRE_AUTH_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "../common/common.h"
#include "crypto.h"
#include "protocol.h"
#include "socket.h"

namespace bps {

// The server's side, in two steps, so that one thread can wait for many introductions
// (waiting_room.h): the challenge goes out at the accept, and once kHelloFrameBytes
// have arrived (or the peer closed), WelcomeWorker reads exactly those without
// waiting, checks the proof and answers.
constexpr size_t kHelloFrameBytes = sizeof(FrameHeader) + sizeof(Nonce) + sizeof(Digest);
Status ChallengeWorker(Connection& connection, Nonce* challenge);
Status WelcomeWorker(Connection& connection, const JobSecret& secret, int num_workers,
                     const Nonce& challenge, uint32_t* rank);
// Both steps on one connection, waiting up to `timeout_ms` for the hello (tests, tools).
Status AuthenticateWorker(Connection& connection, const JobSecret& secret, int num_workers,
                          int timeout_ms, uint32_t* rank);

// The worker's side, on a freshly opened connection: OK once the server has proven the
// token too, all within `timeout_ms` however the other side paces its bytes. A kError
// refusal fails with kInvalidArgument and the server's (escaped) reason; anything
// else that is not a proven server fails with kInternal, or kPeerGone when it closed
// the connection before its challenge (a server turning connections away).
Status AuthenticateServer(Connection& connection, const JobSecret& secret, uint32_t rank,
                          int timeout_ms);

}  // namespace bps

#endif  // TF_BPS_WIRE_AUTH_H_
