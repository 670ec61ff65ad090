package httpmw

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/warden-go/warden/fence"
	"github.com/warden-go/warden/guard"
)

// The headers of a fenced request: the fencing token of the lock the client
// holds, in decimal, and the resource it fences (no standard names them).
const (
	FencingTokenHeader    = "Fencing-Token"
	FencingResourceHeader = "Fencing-Resource"
)

// FenceOption configures the Fence middleware.
type FenceOption func(*fenceConfig)

type fenceConfig struct {
	resource    func(*http.Request) string
	resourceSet bool
	retryAfter  time.Duration
}

// WithFenceResource names the resource of a request from the request itself
// (its route, say) instead of its Fencing-Resource header, which is then
// ignored: the service, not the client, decides what a token fences.
func WithFenceResource(resource func(*http.Request) string) FenceOption {
	return func(c *fenceConfig) { c.resource, c.resourceSet = resource, true }
}

// WithFenceRetryAfter sets the Retry-After sent when the fence cannot be
// reached (default DefaultRetryAfter); 0 sends none. Fence refuses a
// negative one.
func WithFenceRetryAfter(d time.Duration) FenceOption {
	return func(c *fenceConfig) { c.retryAfter = d }
}

// Fence returns middleware for a service that accepts fenced writes from
// other processes: each request carries the fencing token of the lock its
// client holds (Fencing-Token) and the resource it writes
// (Fencing-Resource), as FenceTransport stamps them. A request whose token
// is below the highest f accepted for the resource gets 409 problem+json
// (Stale fencing token) and never reaches next; otherwise f records its
// token, and next runs with the claim in its context (fence.FromContext).
//
// f keeps the highest tokens: any engine's fence (redislock.Fence,
// etcdlock.Fence, zklock.Fence, sqllock.Fencer). Its check is atomic with
// nothing the handler writes afterwards, so a handler whose writes must
// never land after a newer holder's makes them with the engine's fenced
// writes, under the claim of its context, and answers their refusal with
// WriteStaleFence. When f is the fence those writes use, the resource's
// highest token moves at the check, before the handler's write lands; give
// f a prefix of its own (redislock.WithFencePrefix, ...) to keep the data's
// fence moving only with the data. f then runs ahead of the data's fence:
// once a request passes it, an older claim gets 409 even while the newer
// request's write has not landed (or never does: a still newer one landed
// first, or its handler failed), and the data's fence would still accept
// the older one. The refusal is safe (a newer lock was granted), but it is
// not one the data shows. A nil f checks nothing here and leaves it all to
// those writes, which then alone decide every acceptance and refusal.
//
// Fence trusts the token a request carries: nothing in it tells a token a
// lock granted from one a client made up, or from a token of another
// engine, whose tokens can run far above this one's. Any client that
// reaches the service can send "Fencing-Token: 18446744073709551615" and
// have the resource's fence advanced to it (by f, or by the handler's
// fenced writes), after which every legitimate writer of that resource is
// refused as stale. No bound on a token can be checked here: tokens are
// the engine's (a revision, a clock in microseconds), and a newer holder's
// may lie any distance above the last one accepted. So serve Fence only
// inside the trust boundary of the lock's holders (behind authentication
// that admits only them, on an internal network), never to the public.
// An operator recovers a resource so advanced by setting its fence back to
// the token of the lock's current holder (guard.Guard.Inspect, or the
// warden CLI's "locks show"), or by deleting it: redislock's fence key
// (Fence.Key, "warden:fence:" and the resource; the token is its hash
// field "t"), etcdlock's fence key (Fence.Key, "warden/fence/" and the
// resource), zklock's fence node (Fence.Path, under "/warden/fences") or
// the resource's row of sqllock's fence table ("warden_fences"). A deleted
// fence accepts any token again, a paused holder's older one included,
// until a fenced write advances it; one set to the current holder's token
// does not. What was written under the made-up token stays written.
//
// Fence refuses a nil option, WithFenceResource(nil) (which would leave the
// resource to the client after all) and a negative Retry-After.
func Fence(f fence.Fencer, opts ...FenceOption) (func(http.Handler) http.Handler, error) {
	c := fenceConfig{retryAfter: DefaultRetryAfter}
	for i, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("warden: httpmw: fence: %w: option %d is nil", guard.ErrInvalidOption, i)
		}
		o(&c)
	}
	switch {
	case c.resourceSet && c.resource == nil:
		return nil, fmt.Errorf("warden: httpmw: fence: %w: nil WithFenceResource function", guard.ErrInvalidOption)
	case c.retryAfter < 0:
		return nil, fmt.Errorf("warden: httpmw: fence: %w: Retry-After %v is negative", guard.ErrInvalidOption, c.retryAfter)
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tokens := r.Header.Values(FencingTokenHeader)
			if len(tokens) == 0 {
				writeProblem(w, http.StatusPreconditionRequired, "Missing_fencing_token", "Fencing token missing",
					"The request must carry the "+FencingTokenHeader+" of the lock it is made under.", 0)
				return
			}
			var claim fence.Claim
			var err error
			if len(tokens) == 1 {
				claim.Token, err = strconv.ParseUint(tokens[0], 10, 64)
			}
			if c.resource != nil {
				claim.Resource = c.resource(r)
			} else if rs := r.Header.Values(FencingResourceHeader); len(rs) == 1 {
				claim.Resource = rs[0]
			}
			if len(tokens) != 1 || err != nil || claim.Validate() != nil {
				writeProblem(w, http.StatusBadRequest, "Invalid_fencing_token", "Invalid fencing token",
					"The request needs one "+FencingTokenHeader+", a positive decimal integer, and one "+FencingResourceHeader+" of 1 to "+
						strconv.Itoa(fence.MaxResource)+" bytes.", 0)
				return
			}
			if f != nil {
				err := f.Advance(r.Context(), claim)
				switch {
				case err == nil:
				case errors.Is(err, fence.ErrStaleToken):
					WriteStaleFence(w, err)
					return
				case errors.Is(err, guard.ErrInvalidOption) || errors.Is(err, guard.ErrInvalidKey):
					// A resource the engine cannot name (its own limits).
					writeProblem(w, http.StatusBadRequest, "Invalid_fencing_token", "Invalid fencing token",
						"The "+FencingResourceHeader+" names a resource the service cannot fence.", 0)
					return
				case r.Context().Err() != nil:
					writeProblem(w, http.StatusServiceUnavailable, "Canceled", "Request canceled", "", 0)
					return
				default:
					writeProblem(w, http.StatusServiceUnavailable, "Fence_unavailable", "Fence unavailable", "", c.retryAfter)
					return
				}
			}
			next.ServeHTTP(w, r.WithContext(fence.WithClaim(r.Context(), claim)))
		})
	}, nil
}

// WriteStaleFence answers 409 problem+json of type Stale fencing token: what
// Fence answers a stale claim, for a handler whose own fenced write was
// refused (err wraps fence.ErrStaleToken).
func WriteStaleFence(w http.ResponseWriter, err error) {
	detail := "A write with a higher fencing token was accepted: the lock this request was made under was lost."
	if h := fence.Highest(err); h != 0 {
		detail += " The highest accepted is " + strconv.FormatUint(h, 10) + "."
	}
	writeProblem(w, http.StatusConflict, "Stale_fencing_token", "Stale fencing token", detail, 0)
}

// FenceTransport returns an http.RoundTripper that stamps each request with
// the claim of its context (fence.FromContext: the lock guard.Do's function
// was given, or fence.WithClaim's) in the Fencing-Token and
// Fencing-Resource headers, and sends it through base
// (http.DefaultTransport when nil). A request whose context carries no
// claim, or that already has a Fencing-Token, goes as it is. A claim that
// fails fence.Claim.Validate, or whose resource a header cannot carry as it
// is (a leading or trailing space or tab, which the server trims, making
// "a " the resource "a"; a control byte), is not sent: the request fails
// with an error wrapping guard.ErrInvalidOption.
//
//	client := &http.Client{Transport: httpmw.FenceTransport(nil)}
//	g.Do(ctx, "account/42", func(ctx context.Context, _ *guard.Lock) error {
//		req, _ := http.NewRequestWithContext(ctx, "PUT", url, body)
//		resp, err := client.Do(req) // carries the lock's token
//		...
//	})
func FenceTransport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return fenceTransport{base: base}
}

type fenceTransport struct{ base http.RoundTripper }

func (t fenceTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c, ok := fence.FromContext(r.Context())
	if !ok || r.Header.Get(FencingTokenHeader) != "" {
		return t.base.RoundTrip(r)
	}
	if err := sendable(c); err != nil {
		if r.Body != nil {
			r.Body.Close() // a RoundTripper closes the body, even on errors
		}
		return nil, err
	}
	// A RoundTripper must not change the request it was given.
	r = r.Clone(r.Context())
	r.Header.Set(FencingTokenHeader, strconv.FormatUint(c.Token, 10))
	r.Header.Set(FencingResourceHeader, c.Resource)
	return t.base.RoundTrip(r)
}

// sendable reports a claim that cannot reach a service as it is: an invalid
// one, or one whose resource a header value would change or refuse.
func sendable(c fence.Claim) error {
	if err := c.Validate(); err != nil {
		return err
	}
	bad := c.Resource != strings.Trim(c.Resource, " \t")
	for i := 0; i < len(c.Resource) && !bad; i++ {
		b := c.Resource[i]
		bad = b < ' ' && b != '\t' || b == 0x7f
	}
	if bad {
		return fmt.Errorf("warden: httpmw: fence: %w: resource %q cannot travel in the %s header as it is (leading or trailing white space, or a control byte)",
			guard.ErrInvalidOption, c.Resource, FencingResourceHeader)
	}
	return nil
}
