/* server/try.h — ATLAS_SERVER_TRY: return a failed atlas_status from the enclosing function
 * (the library's own ATLAS_TRY is internal to it; the server uses only include/atlas/).
 * Internal to src/server. */
#ifndef ATLAS_SERVER_TRY_H
#define ATLAS_SERVER_TRY_H

#include "atlas/status.h"

#define ATLAS_SERVER_TRY(expr)                                                             \
    do {                                                                                   \
        atlas_status atlas_server_try_st_ = (expr);                                        \
        if (atlas_server_try_st_ != ATLAS_OK) return atlas_server_try_st_;                 \
    } while (0)

#endif
