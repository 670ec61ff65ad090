package zklock

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/fence"
	"github.com/warden-go/warden/guard/driver"
)

// DefaultFenceRoot is the node under which a Fence keeps one node per
// resource.
const DefaultFenceRoot = "/warden/fences"

// Fence makes fenced writes to ZooKeeper (package fence): a multi that holds
// the caller's operations and, first, the set of the resource's fence node
// at the version last read, to the claim's token. ZooKeeper applies a multi
// whole or not at all, so the operations are applied only if the fence did
// not move since it was read and the token was not below it.
//
// A resource's fence node is the root (DefaultFenceRoot) followed by the
// resource's name, path-escaped into one node ("a/b" is "a%2Fb", ".." is
// "%2E%2E"); its data is the highest token accepted, in decimal, and every
// accepted multi sets it, so that its version counts the writes it fenced.
type Fence struct {
	conn *zk.Conn
	root string
	acl  []zk.ACL
}

// FenceOption configures a Fence.
type FenceOption func(*Fence)

// WithFenceRoot replaces DefaultFenceRoot; it must be an absolute path.
func WithFenceRoot(root string) FenceOption { return func(f *Fence) { f.root = root } }

// WithFenceACL sets the ACL of the nodes the Fence creates (default
// zk.WorldACL(zk.PermAll)).
func WithFenceACL(acl []zk.ACL) FenceOption { return func(f *Fence) { f.acl = acl } }

// NewFence returns a Fence on conn, the caller's ZooKeeper connection (the
// one its own operations go through). On an ensemble whose ACLs ask for
// credentials, the caller adds them to conn (conn.AddAuth) before the
// Fence's first call, as it does for its own operations; an ACL given to
// WithFenceACL must grant conn's identity what its multis need: read the
// fence node, write it, and create it under the root.
func NewFence(conn *zk.Conn, opts ...FenceOption) (*Fence, error) {
	if conn == nil {
		return nil, fmt.Errorf("warden: zklock: %w: nil connection", driver.ErrInvalidOption)
	}
	f := &Fence{conn: conn, root: DefaultFenceRoot, acl: zk.WorldACL(zk.PermAll)}
	for _, o := range opts {
		o(f)
	}
	if !strings.HasPrefix(f.root, "/") || strings.HasSuffix(f.root, "/") {
		return nil, fmt.Errorf("warden: zklock: %w: fence root %q is not an absolute node path", driver.ErrInvalidOption, f.root)
	}
	return f, nil
}

// Path returns the fence node of resource.
func (f *Fence) Path(resource string) string { return f.root + "/" + fenceNode(resource) }

// fenceNode is resource's node name: path-escaped, and "." and ".." (which
// ZooKeeper refuses as names) with their dots escaped too, as "%2E" and
// "%2E%2E", names the path escape never makes, since it escapes "%".
func fenceNode(resource string) string {
	if resource == "." || resource == ".." {
		return strings.Repeat("%2E", len(resource))
	}
	return url.PathEscape(resource)
}

// Multi applies ops (*zk.CreateRequest, *zk.SetDataRequest,
// *zk.DeleteRequest, *zk.CheckVersionRequest) under c, in one multi with
// the fence's, and returns their responses. It returns an error wrapping
// fence.ErrStaleToken, having applied nothing, when the resource accepted a
// higher token; an error of one of ops (zk.ErrBadVersion, ...) when the
// server refused it, the fence unchanged. When another writer moved the
// fence between the read and the multi, Multi reads it again and retries,
// until ctx ends. A multi whose answer was lost (a broken connection) is not
// resent: its error wraps guard.ErrUnavailable, and it may have been
// applied, once. An operation of another type, a nil one, or one on the
// fence node itself is refused with guard.ErrInvalidOption.
func (f *Fence) Multi(ctx context.Context, c fence.Claim, ops ...any) ([]zk.MultiResponse, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	path := f.Path(c.Resource)
	if err := checkOps(path, ops); err != nil {
		return nil, err
	}
	token := []byte(strconv.FormatUint(c.Token, 10))
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var op any
		data, stat, err := fenceCall(ctx, func() ([]byte, *zk.Stat, error) { return f.conn.Get(path) })
		switch {
		case errors.Is(err, zk.ErrNoNode):
			if err := f.ensureRoot(ctx); err != nil {
				return nil, err
			}
			op = &zk.CreateRequest{Path: path, Data: token, Acl: f.acl}
		case err != nil:
			return nil, f.unavailable(ctx, c, err)
		default:
			high, err := strconv.ParseUint(string(data), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("warden: zklock: %w: the fence of %q holds %q, not a token", driver.ErrUnavailable, c.Resource, data)
			}
			if c.Token < high {
				return nil, fence.Stale(c, high)
			}
			op = &zk.SetDataRequest{Path: path, Data: token, Version: stat.Version}
		}
		resps, _, err := fenceCall(ctx, func() ([]zk.MultiResponse, *zk.Stat, error) {
			r, err := f.conn.Multi(append([]any{op}, ops...)...)
			return r, nil, err
		})
		if err == nil {
			return resps[1:], nil
		}
		if len(resps) > 0 {
			if fe := resps[0].Error; errors.Is(fe, zk.ErrBadVersion) || errors.Is(fe, zk.ErrNodeExists) || errors.Is(fe, zk.ErrNoNode) {
				continue // the fence moved: read it again
			}
			return resps[1:], fmt.Errorf("warden: zklock: fenced multi on %q: %w", c.Resource, err)
		}
		return nil, f.unavailable(ctx, c, err)
	}
}

// checkOps refuses, before any round trip, an operation the client cannot
// send (it would fail only once the multi is built, as if the server were
// unreachable) and one on the fence node itself, whose delete would let
// every lower token write again.
func checkOps(fenceNode string, ops []any) error {
	for i, op := range ops {
		path, ok := opPath(op)
		switch {
		case !ok:
			return fmt.Errorf("warden: zklock: %w: fenced operation %d is a %T, not a non-nil *zk.CreateRequest, *zk.SetDataRequest, *zk.DeleteRequest or *zk.CheckVersionRequest", driver.ErrInvalidOption, i, op)
		case path == fenceNode:
			return fmt.Errorf("warden: zklock: %w: fenced operation %d is on the fence node %s itself", driver.ErrInvalidOption, i, path)
		}
	}
	return nil
}

// opPath is the node a multi's operation is on; ok is false for one the
// client cannot send.
func opPath(op any) (path string, ok bool) {
	switch op := op.(type) {
	case *zk.CreateRequest:
		if op != nil {
			return op.Path, true
		}
	case *zk.SetDataRequest:
		if op != nil {
			return op.Path, true
		}
	case *zk.DeleteRequest:
		if op != nil {
			return op.Path, true
		}
	case *zk.CheckVersionRequest:
		if op != nil {
			return op.Path, true
		}
	}
	return "", false
}

// Advance checks and advances c's resource without writing: fence.Fencer.
func (f *Fence) Advance(ctx context.Context, c fence.Claim) error {
	_, err := f.Multi(ctx, c)
	return err
}

// Highest returns the highest token resource accepted, 0 if none, and the
// fence node's version (-1 when there is none).
func (f *Fence) Highest(ctx context.Context, resource string) (uint64, int32, error) {
	data, stat, err := fenceCall(ctx, func() ([]byte, *zk.Stat, error) { return f.conn.Get(f.Path(resource)) })
	if errors.Is(err, zk.ErrNoNode) {
		return 0, -1, nil
	}
	if err != nil {
		return 0, 0, f.unavailable(ctx, fence.Claim{Resource: resource}, err)
	}
	high, err := strconv.ParseUint(string(data), 10, 64)
	return high, stat.Version, err
}

func (f *Fence) ensureRoot(ctx context.Context) error {
	p := ""
	for _, part := range strings.Split(f.root[1:], "/") {
		p += "/" + part
		node := p
		_, _, err := fenceCall(ctx, func() (string, *zk.Stat, error) {
			s, err := f.conn.Create(node, nil, zk.FlagPersistent, f.acl)
			return s, nil, err
		})
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return driver.Unavailable(ctx, fmt.Errorf("warden: zklock: fence root %s: %w", node, err))
		}
	}
	return nil
}

func (f *Fence) unavailable(ctx context.Context, c fence.Claim, err error) error {
	return driver.Unavailable(ctx, fmt.Errorf("warden: zklock: fence %q: %w", c.Resource, err))
}

// fenceCall runs a ZooKeeper request, which takes no context, and returns when
// it answers or ctx ends.
func fenceCall[T any](ctx context.Context, fn func() (T, *zk.Stat, error)) (T, *zk.Stat, error) {
	type result struct {
		v    T
		stat *zk.Stat
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		v, s, err := fn()
		ch <- result{v, s, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.stat, r.err
	case <-ctx.Done():
		var zero T
		return zero, nil, ctx.Err()
	}
}
