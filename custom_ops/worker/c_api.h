/* C API of the tf_bps core: the only entry point of framework adapters (the
 * TensorFlow kernels) and of the Python binding. Plain C types only, so that
 * libraries built with other compiler flags can call it. Functions returning int
 * return 0 on success and -1 on failure; bps_last_error() then holds the message. */
#ifndef TF_BPS_WORKER_C_API_H_
#define TF_BPS_WORKER_C_API_H_

#ifdef __cplusplus
extern "C" {
#endif

/* The core's values, as its frames carry them. The operation kinds are one per row of
 * wire/op_kinds.def, which also says what each does: BPS_PUSH_PULL, BPS_BROADCAST,
 * BPS_ALLGATHER, BPS_ALLTOALL, BPS_REDUCESCATTER, BPS_ASYNC_PUSH_PULL, and
 * BPS_COMPRESSED_PUSH_PULL, which the core picks itself and refuses from an adapter
 * (ask for a push_pull with a compressor). common.h holds the other enums for C++, and
 * c_api.cc checks that they agree. */
typedef enum bps_op_kind {
#define BPS_OP_KIND(name, c_name, value, text, worker_policy, server_policy) BPS_##c_name = value,
#include "../wire/op_kinds.def"
#undef BPS_OP_KIND
} bps_op_kind;

typedef enum bps_dtype {
  BPS_FLOAT16 = 1,
  BPS_BFLOAT16 = 2,
  BPS_FLOAT32 = 3,
  BPS_FLOAT64 = 4,
  BPS_INT32 = 5,
  BPS_INT64 = 6,
  BPS_UINT8 = 7,
  BPS_INT8 = 8,
  BPS_UINT16 = 9,
  BPS_INT16 = 10,
  BPS_BOOL = 11 /* one byte per element, 0 or 1 */
} bps_dtype;

typedef enum bps_reduce_op {
  BPS_SUM = 0,
  BPS_AVERAGE = 1,
  BPS_MIN = 2,
  BPS_MAX = 3,
  BPS_PRODUCT = 4
} bps_reduce_op;

/* Why an operation failed, so that an adapter raises the matching error class. */
typedef enum bps_error_kind {
  BPS_OK = 0,
  BPS_INVALID_ARGUMENT = 1, /* the caller's input is unusable */
  BPS_MISMATCH = 2,         /* workers disagree on a tensor's shape, dtype, root, op... */
  BPS_PEER_GONE = 3,        /* a server or worker died or closed its connection */
  BPS_ABORTED = 4,          /* the round was abandoned (another worker failed) */
  BPS_TIMEOUT = 5,          /* BYTEPS_OP_TIMEOUT passed */
  BPS_INTERNAL = 6,         /* a bug, or a malformed peer */
  BPS_SHUTDOWN = 7          /* tf_bps is not initialised, or was shut down */
} bps_error_kind;

/* "push_pull", "peer gone", ...: the names messages use; "unknown" for other values. */
const char* bps_op_kind_name(int kind);
const char* bps_error_kind_name(int kind);

const char* bps_last_error(void);
/* The error kind (bps_error_kind) of the last failure on this thread. */
int bps_last_error_kind(void);
/* 0 trace, 1 debug, 2 info, 3 warning, 4 error. */
void bps_set_logging(int level, const char* prefix);
/* Who besides this process's own uid may reach it over a local (Unix) socket: a worker
 * or server of the job on this host (BYTEPS_LOCAL_UIDS). Set before bps_worker_init. */
void bps_set_local_uids(const unsigned int* uids, int count);

/* Worker. Exactly one of the two init calls, then bps_worker_shutdown. */
int bps_worker_init_local(void);
/* One server of the job. */
typedef struct bps_server_address {
  const char* host;
  int port;
  int same_host; /* on this host: try its Unix socket and shared memory first */
} bps_server_address;

/* How a worker joins its servers (bps_worker_init): the job's facts, and its
 * variables in `settings`. */
typedef struct bps_worker_config {
  int rank;
  int size;
  const bps_server_address* servers; /* in the scheduler's order */
  int num_servers;
  const char* token; /* the job's (BYTEPS_JOB_TOKEN), proven to every server and by it */
  /* The workers of this host, ascending; with more than one, push_pull merges among
   * them first, over Unix sockets named `local_socket_prefix` + rank. None: every
   * worker pushes its own copy. */
  const int* local_ranks;
  int num_local_ranks;
  const char* local_socket_prefix;
  /* The job spans several hosts (the same on every worker): partitions are cut for a
   * network, smaller and more of them. */
  int across_hosts;
  /* How many partitions each server gets relative to the others, one per server (the
   * same on every worker); NULL: the same number. */
  const int* server_shares;
  /* The job generation of the address book (the scheduler's; 0 until the job first
   * re-forms): servers of another refuse this worker. */
  unsigned int generation;
  /* An elastic, synchronous job: a lost server's partitions wait for
   * bps_worker_move_lost_server (at most PS_HEARTBEAT_TIMEOUT) instead of failing. */
  int move_lost_servers;
  /* The write end of a non-blocking pipe that gets a byte whenever a server is lost;
   * -1: none. */
  int notify_fd;
  /* The variables of the settings table (settings.def) that the
   * process's environment sets, as tf_bps/runtime/config.py read them: "NAME=value"
   * each, besides NVIDIA_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES, which the table's
   * rules read. The others take the table's defaults. They are checked as config.py
   * checks them; a bad one fails bps_worker_init naming it. */
  const char* const* settings;
  int num_settings;
} bps_worker_config;
int bps_worker_init(const bps_worker_config* config);
void bps_worker_abort(const char* reason);
/* The indices (in the config's servers) of the servers that went away without a word,
 * in that order: up to `capacity` into `out`; returns how many there are. An elastic
 * job's scheduler hears of them from the worker. */
int bps_worker_lost_servers(int* out, int capacity);
/* The scheduler says server `server` (an index in the config's servers) is gone from
 * the job: its partitions go to the servers left (move_lost_servers only). */
int bps_worker_move_lost_server(int server);
/* Copies why the worker failed (a server died, say; empty when healthy) into buf. */
int bps_worker_failure(char* buf, int capacity);
void bps_worker_shutdown(void);

/* What this process's workers have done since it started, across the engines an
 * elastic job makes (worker/stats.h): the figures of its metrics endpoint. */
/* push_pull input sizes up to 4 KiB, 64 KiB, 1 MiB, 16 MiB, 256 MiB, and more; and
 * latencies up to 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250 ms, 0.5, 1, 2.5, 5, 10 s, and more. */
#define BPS_STATS_SIZE_CLASSES 6
#define BPS_STATS_LATENCY_BUCKETS 15
typedef struct bps_worker_stats {
  unsigned long long steps;  /* rounds of the step tensor, the first one reduced */
  double step_seconds_sum;   /* between consecutive steps (steps - 1 of them) */
  double last_step_seconds;
  double last_step_time;     /* when the last step ended, in seconds since the epoch; 0: none */
  unsigned long long pushed_bytes;     /* sent to the servers, compressed where compressed */
  unsigned long long pushed_raw_bytes; /* the same partitions before compression */
  unsigned long long pulled_bytes;     /* answers from the servers */
  unsigned long long failed_operations;
  /* Finished push_pulls by input size class and by latency bucket (not cumulative). */
  unsigned long long push_pull_counts[BPS_STATS_SIZE_CLASSES][BPS_STATS_LATENCY_BUCKETS];
  double push_pull_seconds[BPS_STATS_SIZE_CLASSES];
} bps_worker_stats;
void bps_worker_read_stats(bps_worker_stats* out);
/* The upper bounds of the size classes (bytes) and of the latency buckets (seconds):
 * BPS_STATS_SIZE_CLASSES - 1 and BPS_STATS_LATENCY_BUCKETS - 1 of them. */
const unsigned long long* bps_stats_size_bounds(void);
const double* bps_stats_latency_bounds(void);
/* Horovod's join: blocks until every worker has joined (others' operations go on
 * without this one meanwhile); writes the last rank to join. */
int bps_worker_join(int* last_rank);
/* This worker's rank; -1 before init. */
int bps_worker_rank(void);
/* Records the timeline of the operations that start from now on, of steps `first_step`
 * to `last_step` (a step is a tensor's round; last_step 0: every step from first_step),
 * into the file `path`: BYTEPS_TRACE_ON's window right after bps_worker_init, Horovod's
 * start_timeline at any time. A recording in progress ends, and this returns once its
 * file is written, as bps_worker_stop_timeline does. Without servers it does nothing. */
int bps_worker_start_timeline(const char* path, int first_step, int last_step);
/* Horovod's stop_timeline: ends the recording in progress (none: nothing to do) and
 * returns once its file is written, or after the operation timeout if operations it
 * took are still running (the file follows once they end). */
int bps_worker_stop_timeline(void);
/* The learning rate of the step whose push_pulls are enqueued next (> 0): compressed
 * push_pulls with error feedback rescale their residual by the old rate over the new
 * one when it changes. Without servers, or before init, it does nothing. */
void bps_set_learning_rate(double learning_rate);
/* Gives the `count` tensors named in `names` their priority, in that order (earlier
 * goes first), unless they already have one. Without servers it does nothing. */
int bps_worker_declare(const char* const* names, int count);
/* Registers process set `id` (> 0) with `count` ranks of this job here and at every
 * server; count 0 removes it. Every worker registers the same sets in the same order. */
int bps_worker_set_process_set(int id, const int* ranks, int count);

/* One collective on one tensor. A push_pull with `compression` travels compressed: the
 * core picks that wire kind itself. */
typedef struct bps_op {
  const char* name; /* stable across workers and steps; copied */
  int kind;         /* bps_op_kind */
  int dtype;        /* bps_dtype */
  int reduce_op;    /* bps_reduce_op, for reductions */
  int root_rank; /* broadcast */
  double prescale;
  double postscale;
  int ndims;
  const long long* shape; /* copied */
  const void* input;
  /* NULL for allgather, alltoall and reducescatter: the core asks for it through
   * bps_allocate_fn once its size is known. */
  void* output;
  unsigned long long bytes; /* of the input */
  const long long* splits;  /* alltoall: rows for each rank (copied); NULL: even split */
  int nsplits;
  int process_set; /* 0: every worker */
  /* push_pull: the compressor's text ("topk k=0.01 ef=vanilla", compression/compressor.h);
   * NULL or "": none. A float32 sum or average in the global set of at least
   * min_compress_bytes is compressed on the way to the servers and back. */
  const char* compression;
  /* 0: input and output are host memory. 1: they are memory of device `device` (an
   * ordinal of the table bps_device_use loaded), and the caller queued the work that
   * writes the input on `stream` (NULL: the default stream). The core waits for that
   * work on a stream of its own, and the caller's stream then waits for the output:
   * `done` may run before the output is written, but `stream` sees it written. An
   * alltoall's output 1 (its splits) stays in host memory. */
  int on_device;
  int device;
  void* stream;
} bps_op;

/* Loads the table through which the core stages tensors in device memory
 * (device_api.h): the CUDA one of the core's CUDA library at `library` (_bps_gpu),
 * or, with NULL or "", the one in which host memory stands in for a device (for
 * tests). Once per process, before bps_worker_init; 0 on success. */
int bps_device_use(const char* library);
/* The name of the device table in use ("CUDA", "host stand-in"); "" before any. */
const char* bps_device_table(void);

/* Returns the buffer of output `index` (0 the result, 1 an alltoall's received
 * splits, int64) for the shape, or NULL if it cannot. */
typedef void* (*bps_allocate_fn)(void* ctx, int index, const long long* shape, int ndims);
/* error_kind 0 is success; otherwise message says what failed (valid during the call). */
typedef void (*bps_done_fn)(void* ctx, int error_kind, const char* message);

/* Asynchronous: `done` runs exactly once, on a core thread or before this returns.
 * input/output must stay valid until then. */
void bps_enqueue(const bps_op* op, bps_allocate_fn allocate, bps_done_fn done, void* ctx);

/* BytePS's compressors as the core runs them, for adapters and for tests that check
 * their formats; `spec` is a compressor's text, as bps_op's `compression`. On failure
 * (-1) bps_last_error says what is wrong with the spec or the data. */
/* Writes the canonical text of `spec` (what workers declare) into `out`, NUL-terminated;
 * returns its length, or -1 (a bad spec, or `capacity` too small). */
int bps_compression_canonical(const char* spec, char* out, int capacity);
/* The bytes that `count` float32 elements compress to under `spec`; -1 when the spec
 * is bad or compresses nothing. */
long long bps_compressed_bytes(const char* spec, unsigned long long count);
/* Compresses `count` float32 `values` as partition `stream` of `round` (a fresh
 * compressor: no earlier error feedback) into `out` (bps_compressed_bytes long). */
int bps_compress(const char* spec, const float* values, unsigned long long count,
                 unsigned long long stream, unsigned int round, char* out);
/* Decompresses `bytes` of `data` into `count` float32 elements at `out`; -1 when the
 * data is not `count` elements' well-formed compressed form. */
int bps_decompress(const char* spec, const char* data, unsigned long long bytes,
                   unsigned long long count, float* out);

/* The scheduler's messages with BYTEPS_ENCRYPT (custom_ops/wire/crypto.h), for the
 * Python side of the control plane: a registration's two 32-byte keys (node to
 * scheduler, then scheduler to node) into `keys` (64 bytes), from the job token and
 * both nonces as they travel; 0 on success. */
int bps_control_keys(const char* token, const char* scheduler_nonce, const char* node_nonce,
                     unsigned char* keys);
/* Seals `bytes` of `clear` as message `sequence` under the 32-byte `key` into `out`
 * (`bytes` + 16 long); 0 on success. */
int bps_seal_message(const unsigned char* key, unsigned long long sequence, const char* clear,
                     int bytes, char* out);
/* Opens `bytes` of `sealed` (16 or more) into `out` (`bytes` - 16 long); 0 when it
 * authenticates as message `sequence` under `key`. */
int bps_open_message(const unsigned char* key, unsigned long long sequence, const char* sealed,
                     int bytes, char* out);

#ifdef __cplusplus
}
#endif

#endif /* TF_BPS_WORKER_C_API_H_ */
