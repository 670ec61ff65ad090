package zklock

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/guard/driver"
)

// WithAuth adds credentials to the Locker's session, as ZooKeeper's
// addauth does: scheme is the server's authentication provider ("digest"
// for the user:password credentials of a digest ACL), auth what it takes
// ("alice:secret"; a digest credential with no ':', an empty user or an
// empty password is refused with driver.ErrInvalidOption, as the zk://
// URL refuses it). Given several times, every credential is added, and
// the session has the identities of all of them. They are the arguments
// of go-zookeeper's Conn.AddAuth, which a connection given to NewStore or
// NewFence takes.
//
// The Locker sends them on every connection it makes, as soon as the
// server has answered the handshake and before any request of its own, so
// that a session is never seen without them: on its first connection, on
// each that takes the session up again after an outage, and on those of a
// new session after an expiry or a server that lost its data. An ensemble
// that refuses them (AUTH_FAILED: no provider for the scheme, or one that
// says no) closes the connection: the Locker then makes no further
// connection, as ZooKeeper's own client stops, and every call fails at
// once with an error wrapping driver.ErrInvalidOption and zk.ErrAuthFailed
// that names the scheme. A digest provider refuses nothing: a wrong password
// gives an identity the ACL does not grant, and the requests it refuses fail
// with zk.ErrNoAuth (see WithACL). Neither the credentials nor any part of
// them but a digest user name appear in an error or a log line.
func WithAuth(scheme string, auth []byte) Option {
	return func(c *config) error {
		switch {
		case scheme == "" || strings.ContainsFunc(scheme, func(r rune) bool { return r <= ' ' || r == ':' || r >= 0x7f }):
			return fmt.Errorf("%w: zookeeper credentials: scheme %q, want a provider's name (digest)", driver.ErrInvalidOption, scheme)
		case scheme == "digest":
			if err := checkDigest(string(auth)); err != nil {
				return fmt.Errorf("%w: zookeeper digest credentials: %s", driver.ErrInvalidOption, err)
			}
		}
		c.creds = append(c.creds, credential{scheme: scheme, auth: slices.Clone(auth)})
		return nil
	}
}

// checkDigest says why auth cannot be a digest user's credentials, which
// the server reads as user:password, the user up to the first ':'. Neither
// may be empty: an empty password, which a stray ':' gives, is refused as a
// missing one, as the zk:// URL refuses it, rather than sent as a password
// no ACL entry was likely made for. The message quotes no part of auth.
func checkDigest(auth string) error {
	user, password, ok := strings.Cut(auth, ":")
	switch {
	case !ok:
		return errors.New("no ':' between the user and the password, want user:password")
	case user == "":
		return errors.New("empty user, want user:password")
	case password == "":
		return errors.New("empty password, want user:password")
	}
	return nil
}

// credential is one of WithAuth's.
type credential struct {
	scheme string
	auth   []byte
}

// digestUser is the user of a digest credential, and "" for a credential
// of another scheme.
func (c credential) digestUser() string {
	if c.scheme != "digest" {
		return ""
	}
	user, _, _ := strings.Cut(string(c.auth), ":")
	return user
}

// authenticated reports whether c gives the session an identity the
// server writes in place of an "auth" entry: one its provider calls
// authenticated. The ip provider's is not (it names the client's address,
// which every session has); a provider the Locker does not know (sasl,
// x509, the server's own) is taken to give one.
func (c credential) authenticated() bool { return c.scheme != "ip" }

// String names the credential without its secret: the scheme, and a
// digest's user.
func (c credential) String() string {
	if user := c.digestUser(); user != "" {
		return fmt.Sprintf("digest user %q", user)
	}
	return fmt.Sprintf("scheme %q", c.scheme)
}

// credentials are the Locker's, and whether the ensemble refused them. The
// zero value is no credentials, never refused.
type credentials struct {
	list []credential
	// requests are list's setAuth requests, encoded once, which every
	// connection sends after its handshake (see sniffConn.Read).
	requests []byte

	once    sync.Once
	refused chan struct{} // closed when the ensemble refused one
	err     error         // why, once refused is closed
}

// The setAuth request: a request header with the xid ZooKeeper's clients
// give it, which its answer carries back, and the opcode; then the
// packet's type (0), the scheme and the credential, each after its length.
// Its answer is a reply header: xid, zxid, error code.
const (
	authXid      = -4
	opSetAuth    = 100
	replyHeader  = 16
	authFailCode = -115
)

// set makes list the credentials, with their requests encoded.
func (c *credentials) set(list []credential) {
	c.list, c.refused = list, make(chan struct{})
	xid := int32(authXid)
	for _, cr := range list {
		body := binary.BigEndian.AppendUint32(nil, uint32(xid))
		body = binary.BigEndian.AppendUint32(body, opSetAuth)
		body = binary.BigEndian.AppendUint32(body, 0)
		body = binary.BigEndian.AppendUint32(body, uint32(len(cr.scheme)))
		body = append(body, cr.scheme...)
		body = binary.BigEndian.AppendUint32(body, uint32(len(cr.auth)))
		body = append(body, cr.auth...)
		c.requests = binary.BigEndian.AppendUint32(c.requests, uint32(len(body)))
		c.requests = append(c.requests, body...)
	}
}

// refuse records that the ensemble refused cr.
func (c *credentials) refuse(cr credential) {
	c.once.Do(func() {
		c.err = fmt.Errorf("%w: zookeeper refused the credentials of %s (%w): the server has no provider for the scheme, or its provider refused them; the Locker makes no further request, and a new one with other credentials is needed", driver.ErrInvalidOption, cr, zk.ErrAuthFailed)
		close(c.refused)
	})
}

// refusal is the error of every call once the ensemble refused the
// credentials, and nil until then.
func (c *credentials) refusal() error {
	select {
	case <-c.refused:
		return c.err
	default:
		return nil
	}
}

// describe lists creds, without their secrets, for an error.
func describe(creds []credential) string {
	var s []string
	for _, cr := range creds {
		s = append(s, cr.String())
	}
	return strings.Join(s, ", ")
}

// readAnswers reads, from in, the answers to the setAuth requests sent
// once the connect response was read, which come before the answer to any
// request of the client library's. It returns an error when the server
// refused one, or answered something else.
func (c *credentials) readAnswers(in *bufio.Reader) error {
	for _, cr := range c.list {
		h, err := in.Peek(4 + replyHeader)
		if err != nil {
			return err
		}
		size := binary.BigEndian.Uint32(h)
		if xid := int32(binary.BigEndian.Uint32(h[4:])); xid != authXid || size < replyHeader {
			return fmt.Errorf("zklock: answer with xid %d where the credentials' was due", xid)
		}
		if code := int32(binary.BigEndian.Uint32(h[4+12:])); code != 0 {
			if code == authFailCode {
				c.refuse(cr)
				return c.err
			}
			return fmt.Errorf("zklock: the credentials of %s answered with error code %d", cr, code)
		}
		if _, err := in.Discard(4 + int(size)); err != nil {
			return err
		}
	}
	return nil
}

// checkOwnACL says why a Locker whose session has creds could not use
// acl, the ACL of the nodes it creates: no entry that may match the
// session grants it create, or none grants it delete. The session has the
// identity world:anyone, its address's (ip), and its credentials'; an ACL
// is judged as the server enforces it for a user who is not its super
// user, on a server whose ACLs are not switched off (skipACL).
//
// A digest entry is judged by its user alone: its hash is the server's to
// compute (SHA-1 or, with digestAlg, another algorithm, over the password
// as the JVM's default charset decodes it), which the client cannot
// reproduce. An entry for a user none of the credentials name is refused;
// one for a credential's user is taken, and a password that does not give
// its hash (a wrong one) is found out at the first request, which fails
// with zk.ErrNoAuth.
func checkOwnACL(acl []zk.ACL, creds []credential) error {
	var create, del bool
	for _, e := range acl {
		if e.Scheme == "auth" && !slices.ContainsFunc(creds, credential.authenticated) {
			// The server replaces "auth" by the session's authenticated
			// identities, and refuses the ACL (zk.ErrInvalidACL) when
			// there are none.
			if len(creds) == 0 {
				return errors.New(`the "auth" scheme (zk.AuthACL) stands for the session's credentials, and the Locker has none: add them with WithAuth`)
			}
			return fmt.Errorf(`the "auth" scheme (zk.AuthACL) stands for the session's authenticated identities, and the credentials of %s give none (ip names the client's address, which "auth" does not stand for): add a user's with WithAuth, or name the address in an ip entry`, describe(creds))
		}
		if mayMatch(e, creds) {
			create = create || e.Perms&zk.PermCreate != 0
			del = del || e.Perms&zk.PermDelete != 0
		}
	}
	if create && del {
		return nil
	}
	who := "a session without credentials"
	if len(creds) > 0 {
		who = "a session with the credentials of " + describe(creds)
	}
	return fmt.Errorf("no entry grants %s both create and delete on the nodes it creates (is a WithAuth missing, or for another user?)", who)
}

// mayMatch reports whether ACL entry e may match a session with
// credentials creds: a digest entry may match a digest credential of its
// user, "auth" credentials that authenticate; an ip entry may match the
// session's address, and whether an entry of another scheme (x509, sasl,
// a provider of the server's own) matches is the server's to say.
func mayMatch(e zk.ACL, creds []credential) bool {
	switch e.Scheme {
	case "world":
		return e.ID == "anyone"
	case "auth":
		return slices.ContainsFunc(creds, credential.authenticated)
	case "digest":
		user, _, _ := strings.Cut(e.ID, ":")
		return slices.ContainsFunc(creds, func(c credential) bool { return c.scheme == "digest" && c.digestUser() == user })
	}
	return true
}
