/* The UCX API tierstack-ucx-sys binds (see build.rs for the allowlist). */
#include <ucp/api/ucp.h>
