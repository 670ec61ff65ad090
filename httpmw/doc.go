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
// 503, with Retry-After: under Lock, the lock backend could not be reached
// (or did not answer) within the wait.
//
// # Internal
//
// 500: a stored response could not be read, or another unexpected failure.
package httpmw
