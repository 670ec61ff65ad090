// Package httpmw holds net/http middleware built on warden: Idempotency,
// which runs a request carrying an Idempotency-Key at most once and replays
// its response to retries, and Lock, which serialises requests per key. Both
// are plain func(http.Handler) http.Handler, so they compose with net/http,
// chi and gorilla/mux alike.
//
// # When a key runs again
//
// Under Idempotency, a key whose handler has been called is never run a
// second time while its record is retained, whatever the client does: the
// handler's context does not end when the client disconnects (only when
// the claim on the key is lost; WithRequestContext restores net/http's
// behaviour), nor, as in net/http, when the server shuts down (unless
// WithShutdownCancel), and whatever it answers is stored, even for a
// client that is gone. A response that cannot be replayed (streamed,
// hijacked, 101, too large, or cut short by http.ErrAbortHandler once its
// status was chosen, as httputil.ReverseProxy does when the upstream's
// answer cannot be copied) is recorded as executed, not replayable. The
// key frees up for another run only when the handler panics otherwise, or
// when WithStorePolicy chooses not to keep its outcome (DefaultStorePolicy
// keeps everything); a request refused before the handler ran (a bad key, a
// body too large, a concurrent duplicate, a store that cannot be reached)
// leaves the key as it found it. This is the rule Stripe documents for its API
// ("results are only saved if an API endpoint started executing") and the
// one the IETF httpapi Idempotency-Key draft describes.
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
// # Body consumed
//
// 500: a handler or middleware before the idempotency middleware read the
// whole request body, of a known length, not as a form (a form it parsed
// is fingerprinted), so the request cannot be told from another with the
// same key and a different body. Put the idempotency middleware before it.
// A body of unknown length (chunked) read before the middleware looks
// empty, and one read in part looks shorter: neither can be told, and
// each is fingerprinted as what was left.
//
// # In progress
//
// 409, with Retry-After: a request with the same key is still being
// processed.
//
// # Response not stored
//
// 409, with Idempotent-Replayed: true: the request with this key was
// executed, but its response could not be stored for replay (it was
// streamed with Flush, the connection was hijacked or switched protocols,
// or the response was larger than WithMaxResponse or than the store keeps).
// It is not run again; the detail names the status it had, and a Location
// it set is repeated.
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
