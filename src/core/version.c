/* core/version.c — see atlas/version.h: the version compiled into the library, for
 * embedders to compare with the header they were compiled with. */
#include "atlas/version.h"

const char *atlas_version(void) { return ATLAS_VERSION_STRING; }
