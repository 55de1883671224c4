/* What the worker engine asks of a device whose memory holds tensors: streams, copies,
 * completion callbacks and pinned host memory, as a table of plain C functions. The
 * CUDA table lives in the core's CUDA library (cuda/gpu_api.h, bps_gpu_device_api),
 * which the engine loads at run time, so the engine itself links no CUDA. A second
 * table, in the engine, lets host memory stand in for a device (device_host.cc): the
 * staging pipeline then runs and is tested on machines without a GPU.
 *
 * Functions returning int return 0 on success and -1 on failure, with last_error()
 * saying why. `device` is the ordinal of the device a call works on; a null stream is
 * the device's default stream. */
#ifndef TF_BPS_WORKER_DEVICE_API_H_
#define TF_BPS_WORKER_DEVICE_API_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bps_device_api {
  const char* name; /* for logs and errors: "CUDA", "host stand-in" */
  const char* (*last_error)(void);
  int (*stream_create)(int device, void** stream);
  void (*stream_destroy)(int device, void* stream);
  /* Work queued on `waiter` from now on starts only after the work queued on `stream`
   * so far (an event recorded on one, waited for by the other). */
  int (*stream_wait)(int device, void* waiter, void* stream);
  /* Queues a copy of `bytes` between any two of device and pinned host memory. */
  int (*copy)(int device, void* dst, const void* src, size_t bytes, void* stream);
  /* dtype and reduce_op as in common.h: buf[i] *= factor (prescale, postscale). */
  int (*scale)(int device, void* buf, size_t count, int dtype, double factor, void* stream);
  /* buf[i] /= divisor (an average), as common.h's DivideInPlace: integers floor. */
  int (*divide)(int device, void* buf, size_t count, int dtype, int divisor, void* stream);
  /* `fn(arg)` runs once the work queued on `stream` so far is done, on a thread of the
   * device's own; it must not call this table (CUDA forbids it) and must be quick. */
  int (*call_when_done)(int device, void* stream, void (*fn)(void*), void* arg);
  /* Page-locked host memory, which copies to and from the device read at full speed;
   * `device` is the one whose copies use it (its context makes and frees it). */
  int (*host_alloc)(int device, size_t bytes, void** ptr);
  void (*host_free)(int device, void* ptr);

  /* Collectives among the workers of one host, one device each (NCCL on CUDA), for the
   * local merge of device tensors. Every member of a group must queue the same
   * collectives in the same order. */
  /* Where `device` is, so that processes can tell whether they share one (a PCI bus id
   * on CUDA); 0 and a key of at most `size` - 1 characters, or -1 where groups cannot
   * be made at all (no NCCL), last_error() saying why. */
  int (*device_key)(int device, char* key, size_t size);
  /* A fresh group id (BPS_GROUP_ID_BYTES), made by one member and given to the others. */
  int (*group_id)(void* id);
  /* Joins group `id` of `size` members as `member`; returns once every member has. */
  int (*group_open)(int device, const void* id, int size, int member, void** group);
  /* `abort`: members may be gone, so collectives still queued or running end without
   * them; the group's streams may still hold its collectives. */
  void (*group_close)(int device, void* group, int abort);
  /* Whether the collectives have `dtype` (common.h); 0 if not. */
  int (*group_has_dtype)(int dtype);
  /* Combines `count` elements of every member's `src` by `reduce_op` (kSum for kAverage:
   * the engine divides later) into `dst` of member `root`. */
  int (*group_reduce)(int device, const void* src, void* dst, size_t count, int dtype,
                      int reduce_op, int root, void* group, void* stream);
  /* Member `root`'s `count` elements of `buf` into every member's `buf`. */
  int (*group_broadcast)(int device, void* buf, size_t count, int dtype, int root, void* group,
                         void* stream);
  /* 0 while the group's collectives so far ran or run as they should; -1 once one
   * failed (a member gone, say), last_error() saying how. */
  int (*group_check)(int device, void* group);
  /* Collectives queued between the two run as one (NCCL's group calls). */
  int (*group_begin)(void);
  int (*group_end)(void);
} bps_device_api;

#define BPS_GROUP_ID_BYTES 128

/* The table of the core's CUDA library (libname _bps_gpu), where it was built. */
typedef const bps_device_api* (*bps_device_api_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* TF_BPS_WORKER_DEVICE_API_H_ */
