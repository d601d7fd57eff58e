/* parallel/nccl.h — NCCL, loaded at run time (dlopen "libnccl.so.2", or $ATLAS_LIBNCCL), for
 * the all-reduces of tensor parallelism.  Internal.
 *
 * Like the CUDA driver (backend/cuda/driver.h), NCCL is optional and needs no header to
 * build: the types below mirror nccl.h's ABI (NCCL 2.10 .. 2.28; the enum values have not
 * changed since bf16 arrived in 2.10). Where the library is missing, atlas_nccl_open returns
 * ATLAS_ERR_NO_DEVICE with dlerror's text, and the engine runs on one GPU.
 *
 * NVLink multicast (NVLS) is never enabled: atlas_nccl_open sets NCCL_NVLS_ENABLE=0 in the
 * environment, before NCCL can read it, unless it is already "0". On the shared machines
 * atlas is developed on, multicast objects (cuMulticastCreate, which NCCL uses for NVLS
 * all-reduce on NVSwitch systems) can put the GPUs out of service for a long time; the
 * plain ring/tree all-reduce loses little at the message sizes of inference (a few MB).
 * setenv is not thread-safe against concurrent getenv: open NCCL before starting threads.
 *
 * Usage (one process per GPU; see rank.h for how rank 0 hands the id to the others):
 *     rank 0:  atlas_nccl_unique_id(nccl, &id); send id to ranks 1..N-1
 *     all:     atlas_nccl_comm_init(nccl, N, rank, &id, &comm);   // blocks until all joined
 *              atlas_nccl_all_reduce_sum(comm, x, x, n * d, ATLAS_DTYPE_BF16, stream);
 *              atlas_nccl_comm_destroy(comm); atlas_nccl_close(nccl);
 * A failing NCCL call returns ATLAS_ERR_DEVICE with "ncclAllReduce failed: ncclInvalidUsage
 * (invalid usage ...): <ncclGetLastError> (nccl.c:123)". */
#ifndef ATLAS_PARALLEL_NCCL_H
#define ATLAS_PARALLEL_NCCL_H

#include <stddef.h>

#include "atlas/status.h"
#include "core/dtype.h"

/* --- NCCL ABI types (see nccl.h) ---------------------------------------------------------- */
typedef int ncclResult_t; /* ncclSuccess = 0, ... ncclInProgress = 7 */
typedef struct ncclComm *ncclComm_t;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef struct CUstream_st *atlas_nccl_stream; /* cudaStream_t == CUstream */
enum { ATLAS_NCCL_ID_BYTES = 128 };            /* NCCL_UNIQUE_ID_BYTES */
typedef struct ncclUniqueId { char internal[ATLAS_NCCL_ID_BYTES]; } ncclUniqueId;

#define ATLAS_NCCL_SUCCESS 0
#define ATLAS_NCCL_INT8 0
#define ATLAS_NCCL_UINT8 1
#define ATLAS_NCCL_INT32 2
#define ATLAS_NCCL_INT64 4
#define ATLAS_NCCL_FLOAT16 6
#define ATLAS_NCCL_FLOAT32 7
#define ATLAS_NCCL_BFLOAT16 9
#define ATLAS_NCCL_SUM 0

/* The oldest NCCL accepted: 2.10, the first with ncclBfloat16 (version code
 * major * 10000 + minor * 100 + patch since 2.9). */
#define ATLAS_NCCL_MIN_VERSION 21000

/* The entry points atlas uses, named as NCCL names them. */
typedef struct atlas_nccl_fns {
    ncclResult_t (*ncclGetVersion)(int *version);
    ncclResult_t (*ncclGetUniqueId)(ncclUniqueId *id);
    ncclResult_t (*ncclCommInitRank)(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
    ncclResult_t (*ncclCommDestroy)(ncclComm_t comm);
    ncclResult_t (*ncclCommCount)(const ncclComm_t comm, int *count);
    ncclResult_t (*ncclCommUserRank)(const ncclComm_t comm, int *rank);
    ncclResult_t (*ncclAllReduce)(const void *send, void *recv, size_t count,
                                  ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                  atlas_nccl_stream stream);
    ncclResult_t (*ncclGroupStart)(void);
    ncclResult_t (*ncclGroupEnd)(void);
    const char *(*ncclGetErrorString)(ncclResult_t result);
    const char *(*ncclGetLastError)(ncclComm_t comm); /* optional (NCCL >= 2.13): may be NULL */
} atlas_nccl_fns;

typedef struct atlas_nccl atlas_nccl;           /* a loaded NCCL */
typedef struct atlas_nccl_comm atlas_nccl_comm; /* one communicator of this rank */

/* The id rank 0 makes and every rank passes to atlas_nccl_comm_init. */
typedef struct atlas_nccl_id { unsigned char bytes[ATLAS_NCCL_ID_BYTES]; } atlas_nccl_id;

/* Loads NCCL from path (NULL: $ATLAS_LIBNCCL when set, else "libnccl.so.2"), checks its
 * symbols and version. ATLAS_ERR_NO_DEVICE with dlerror's text when it cannot be loaded,
 * ATLAS_ERR_UNSUPPORTED naming the symbol or version otherwise. The library stays mapped
 * after atlas_nccl_close: NCCL's bootstrap and proxy threads may outlive communicators. */
atlas_status atlas_nccl_open(const char *path, atlas_nccl **out);

/* The same over a table the caller fills (tests: a fake that records the calls). The table
 * is copied; every entry but ncclGetLastError must be set. */
atlas_status atlas_nccl_open_table(const atlas_nccl_fns *fns, atlas_nccl **out);

/* Frees nccl. ATLAS_ERR_BUSY with the count, and nothing freed, while communicators made
 * from it are live. NULL is a no-op. */
atlas_status atlas_nccl_close(atlas_nccl *nccl);

/* The version code (22809 for 2.28.9) and the path it was loaded from ("" for a table). */
int atlas_nccl_version(const atlas_nccl *nccl);
const char *atlas_nccl_path(const atlas_nccl *nccl);

/* "" or, when open found NCCL_NVLS_ENABLE set to something other than 0, a note saying so
 * (for the caller's log: the library does not print). */
const char *atlas_nccl_env_note(const atlas_nccl *nccl);

/* A new unique id (rank 0 only). */
atlas_status atlas_nccl_unique_id(atlas_nccl *nccl, atlas_nccl_id *out);

/* Joins the communicator of `world` ranks as `rank` (blocks until every rank has joined) and
 * checks that NCCL agrees on the count and rank. The caller's CUDA context must be current
 * (the process host's). */
atlas_status atlas_nccl_comm_init(atlas_nccl *nccl, int world, int rank, const atlas_nccl_id *id,
                                  atlas_nccl_comm **out);

/* Destroys comm (NULL is a no-op); the error of ncclCommDestroy, if any, after freeing. */
atlas_status atlas_nccl_comm_destroy(atlas_nccl_comm *comm);

int atlas_nccl_comm_world(const atlas_nccl_comm *comm);
int atlas_nccl_comm_rank(const atlas_nccl_comm *comm);

/* recv[count] = sum over ranks of send[count], enqueued on stream (send == recv: in place).
 * dtype F32, F16, BF16, I32, I64 or U8; others are ATLAS_ERR_UNSUPPORTED. */
atlas_status atlas_nccl_all_reduce_sum(atlas_nccl_comm *comm, const void *send, void *recv,
                                       size_t count, atlas_dtype dtype, atlas_nccl_stream stream);

/* Brackets several collectives into one launch (ncclGroupStart / ncclGroupEnd). */
atlas_status atlas_nccl_group_start(atlas_nccl *nccl);
atlas_status atlas_nccl_group_end(atlas_nccl *nccl);

#endif
