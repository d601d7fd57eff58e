/* backend/wformat.c — names of the weight formats of backend.h, for messages and `atlas info`. */
#include "backend/backend.h"

const char *atlas_wformat_name(atlas_wformat f) {
    switch (f) {
    case ATLAS_WFMT_DENSE: return "dense";
    case ATLAS_WFMT_FP8_E4M3: return "FP8 e4m3";
    case ATLAS_WFMT_INT4: return "INT4";
    case ATLAS_WFMT_FP4_E2M1: return "FP4 e2m1";
    default: return "?";
    }
}
