package consullock

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
)

// readToken is the token that the reads a Locker decides by carry (a
// read/write lock's or a semaphore's grant, Inspect, List, ForceRelease, a
// Store's Purge), so that Consul says when it leaves keys out of them.
//
// Consul says that it left keys out of a read (not which: the
// X-Consul-Results-Filtered-By-ACLs header) only to a request that
// carries a token. It reads a request that carries none (none of the
// client's own, and none the agent's default token gives it) as the
// anonymous token's, under either default policy, and filters it without
// a word. Whether a request will carry one cannot be told beforehand: an
// api.Client does not show its token, and the agent's default token,
// which the client's requests without one carry, may be set, replaced or
// cleared at any time. So such a read names its token itself: the secret
// of the token the client's requests carried when Consul was last asked
// (token/self, which answers a token with its own secret), or the
// anonymous token's secret, "anonymous", when they carried none Consul
// knows. Either way Consul says when it leaves keys out of the read,
// whatever the agent's default token has become since it was asked.
//
// An agent with ACLs off says so from its own configuration, without
// asking the servers, which may have them on (ACLs are turned on in the
// servers first): the reads then carry the client's own token, if any
// (secret empty), which such servers judge and report filtering to. A
// client without a token, behind such an agent, is not told of it. That
// answer is not kept: asked again at each read that decides, which costs
// a request the agent answers itself, so that a Locker whose client has
// no token learns at once that its agent came back with ACLs on, rather
// than read unwarned, as the anonymous token, for up to tokenKept.
type readToken struct {
	secret string
	// asked is when Consul was asked.
	asked time.Time
}

// anonymousSecret is the anonymous token's secret, the same in every
// datacenter.
const anonymousSecret = "anonymous"

// tokenKept is how long a Locker reads with the token it found before it
// asks again. Any answer stays sound for as long, since every read names
// its token: it bounds how long a Locker whose client carries the agent's
// default token goes on reading with the token the agent had, and each
// read spared a question is one request fewer (guard.Observe inspects
// every tenth of the TTL).
const tokenKept = time.Minute

// askToken asks Consul which token the client's requests carry, and keeps
// the answer for the reads of the next tokenKept. With ACLs on, a token may
// always read itself, and a request that carries none, or one Consul does
// not know, is refused with 403 "ACL not found"; with ACLs off, Consul
// answers 401 "ACL support disabled".
func (l *Locker) askToken(ctx context.Context) (readToken, error) {
	rctx, cancel := l.rctx(ctx)
	defer cancel()
	self, _, err := l.client.ACL().TokenReadSelf((&api.QueryOptions{}).WithContext(rctx))
	t := readToken{secret: anonymousSecret, asked: time.Now()}
	se := api.StatusError{}
	switch {
	case err == nil:
		// An answer without the secret leaves the anonymous token's,
		// under which Consul says what it leaves out.
		if self != nil && self.SecretID != "" {
			t.secret = self.SecretID
		}
	case errors.As(err, &se) && se.Code == http.StatusUnauthorized && strings.Contains(se.Body, "ACL support disabled"):
		t.secret = "" // see readToken
	case errors.As(err, &se) && se.Code == http.StatusForbidden && strings.Contains(se.Body, "ACL not found"):
	default:
		return readToken{}, l.fail(ctx, rctx, err)
	}
	l.mu.Lock()
	l.token = t
	l.mu.Unlock()
	return t, nil
}

// whole makes read, one that decides, with the token a read carries (see
// readToken); when Consul says that it left keys out of the read, it
// returns hiddenFrom, which names that token for an error, and is empty
// otherwise. A token asked for in an earlier call may no longer be the one
// to read with: the agent's default token replaced and the old one deleted
// (Consul refuses the old one with 403 "ACL not found"), or a client that
// carried none given one (a read as the anonymous token left keys out).
// Such a read is made again, once, when Consul, asked again, names another
// token.
func (l *Locker) whole(ctx context.Context, read func(secret string) (filtered bool, err error)) (hiddenFrom string, err error) {
	l.mu.Lock()
	t := l.token
	l.mu.Unlock()
	kept := !t.asked.IsZero() && time.Since(t.asked) < tokenKept && t.secret != ""
	if !kept {
		if t, err = l.askToken(ctx); err != nil {
			return "", err
		}
	}
	filtered, err := read(t.secret)
	// A read filtered under a real token is taken as it is: asking again
	// at every such read (a List page, while any key is hidden) would
	// double its requests for a change of the agent's default token that
	// tokenKept bounds anyway.
	stale := filtered && t.secret == anonymousSecret || unknownToken(err)
	if kept && stale {
		if again, aerr := l.askToken(ctx); aerr == nil && again.secret != t.secret {
			t = again
			filtered, err = read(t.secret)
		}
	}
	if !filtered || err != nil {
		return "", err
	}
	if t.secret == anonymousSecret {
		return "the anonymous token (the client's requests carry no token Consul knows: give it one that may read them)", nil
	}
	return "the token", nil
}

// unknownToken reports whether err is Consul's refusal of a token it does
// not know (403 "ACL not found"): one deleted, or replaced by a new one
// that the next request may carry, rather than one without the rights.
func unknownToken(err error) bool {
	return errors.Is(err, errDenied) && strings.Contains(err.Error(), "ACL not found")
}
