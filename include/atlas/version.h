/* atlas/version.h — which atlas this is: the release, the API generation, and the macro that
 * marks the public functions.
 *
 * The release is MAJOR.MINOR.PATCH.  ATLAS_API_VERSION is an integer bumped whenever the API
 * or ABI changes incompatibly (a function removed or its signature changed, a struct's layout
 * or an enum value changed); it is the shared library's soname (libatlas.so.N), so a program
 * built against one API version never loads a library of another.  Additions (new functions,
 * new status codes at the end) leave it as it is.
 *
 * An embedder compares the header it was compiled with against the library it runs with:
 *     if (strcmp(atlas_version(), ATLAS_VERSION_STRING)) ... (or just the API version)
 *
 * Every public header includes this one (through atlas/status.h) for ATLAS_API. */
#ifndef ATLAS_VERSION_H
#define ATLAS_VERSION_H

#define ATLAS_VERSION_MAJOR 0
#define ATLAS_VERSION_MINOR 9
#define ATLAS_VERSION_PATCH 0
#define ATLAS_VERSION_STRING "0.9.0"

/* Bumped on every incompatible change of the API or ABI; the soname's number. */
#define ATLAS_API_VERSION 8

/* Marks a public function: exported from libatlas.so, which builds with hidden visibility
 * so that nothing else is. */
#if defined(__GNUC__) || defined(__clang__)
#define ATLAS_API __attribute__((visibility("default")))
#else
#define ATLAS_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The library's version, ATLAS_VERSION_STRING as it was when the library was built (which
 * may differ from the header an embedder compiled against).  Static string, never NULL;
 * any thread. */
ATLAS_API const char *atlas_version(void);

#ifdef __cplusplus
}
#endif
#endif
