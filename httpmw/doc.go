// Package httpmw holds net/http middleware built on warden: Idempotency,
// which runs a request carrying an Idempotency-Key at most once and replays
// its response to retries, and Lock, which serialises requests per key. Both
// are plain func(http.Handler) http.Handler, so they compose with net/http,
// chi and gorilla/mux alike.
//
// Refusals are RFC 9457 problem details (application/problem+json) whose
// type is this page, at the heading of the problem below.
//
// # Missing key
//
// 400: the operation requires an idempotency key (WithRequireKey) and the
// request has none.
//
// # Invalid key
//
// 400: the key header appears more than once, or its value is not a
// Structured Field string (or bare token) of 1 to 255 characters.
//
// # Unreadable body
//
// 400: the request body could not be read to fingerprint it.
//
// # Body too large
//
// 413: the request body exceeds the limit the fingerprint reads.
//
// # In progress
//
// 409, with Retry-After: a request with the same key is still being
// processed.
//
// # Key reused
//
// 422: the key was used before with a different request (method, path,
// query or body).
//
// # Store unavailable
//
// 503, with Retry-After: the idempotency store could not be reached and the
// middleware fails closed.
//
// # Canceled
//
// 503: the client went away while its request waited.
//
// # Locked
//
// 409 (or 423 with WithLockedStatus), with Retry-After: under Lock, another
// request holds the same key and did not finish within the wait bound.
//
// # Invalid lock key
//
// 400: under Lock, the key derived from the request is not a valid lock key.
//
// # Lock unavailable
//
// 503, with Retry-After: under Lock, the lock backend could not be reached.
//
// # Missing fencing token
//
// 428: under Fence, the request carries no Fencing-Token.
//
// # Invalid fencing token
//
// 400: under Fence, the Fencing-Token is not one positive decimal integer,
// or the Fencing-Resource is missing, repeated, longer than
// fence.MaxResource bytes, or not a name the fence's engine accepts.
//
// # Stale fencing token
//
// 409: under Fence, the resource has accepted a higher fencing token than
// the request's (or the handler's own fenced write was refused,
// WriteStaleFence): the lock the client made it under was lost. Retrying
// cannot succeed; the client must take the lock again.
//
// # Fence unavailable
//
// 503, with Retry-After: under Fence, the engine keeping the highest tokens
// could not be reached.
//
// # Internal
//
// 500: a stored response could not be read, or another unexpected failure.
package httpmw
