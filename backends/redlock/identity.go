package redlock

import (
	"context"
	"fmt"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
)

// identityReuse is how long the nodes' identities, once every node's was
// read, are taken as read; a set that misses a node's is read again after
// incompleteReuse. Every read asks all the nodes in one round, so that two
// nodes of one server are never compared across a restart of that server
// (which changes its run_id): an identity read before a restart and the
// other's after it would make them look like two servers. A restart in the
// middle of a round can still do that, until the next read.
const (
	identityReuse   = time.Minute
	incompleteReuse = time.Second
)

// identities are the nodes' servers as one round read them: each node's
// INFO run_id, "" when unknown.
type identities struct {
	ids  []string
	errs []error // by node, why its identity is unknown
	// read is when they were read, and until when they are to be read
	// again (see identityReuse).
	read, until time.Time
	// err, when two nodes answered with one run_id: ErrInvalidOption
	// naming them.
	err error
}

// identify returns the nodes' identities, reading them again, in one round
// on every node, once those read last are too old (see identityReuse), and
// an error wrapping driver.ErrInvalidOption when two nodes are one server,
// whatever the spelling of their addresses: a quorum counted over them
// would count that server twice. One call reads at a time; the others wait
// for it, or for ctx.
func (l *Locker) identify(ctx context.Context) (*identities, error) {
	if s := l.ids.Load(); s != nil && time.Now().Before(s.until) {
		return s, s.err
	}
	select {
	case l.reading <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-l.reading }()
	if s := l.ids.Load(); s != nil && time.Now().Before(s.until) {
		return s, s.err
	}
	rs := l.gather(ctx, func(ctx context.Context, i int) (any, error) {
		return runID(ctx, l.nodes[i])
	}, nil, nil, nil)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	now := time.Now()
	s := &identities{ids: make([]string, len(l.nodes)), errs: make([]error, len(l.nodes)), read: now, until: now.Add(identityReuse)}
	first := make(map[string]int, len(l.nodes))
	for i, r := range rs {
		if r.err != nil {
			s.errs[i] = r.err
			s.until = time.Now().Add(incompleteReuse)
			continue
		}
		id := r.val.(string)
		s.ids[i] = id
		if j, ok := first[id]; ok && s.err == nil {
			s.err = fmt.Errorf("%w: redlock: nodes %d (%s) and %d (%s) are one server (run_id %s)",
				driver.ErrInvalidOption, j, addrOf(l.nodes[j]), i, addrOf(l.nodes[i]), id)
		}
		first[id] = i
	}
	l.ids.Store(s)
	return s, s.err
}

// runID reads the run_id of node's server: random at each start of the
// server, so two nodes that answer with one are one server.
func runID(ctx context.Context, node goredis.UniversalClient) (string, error) {
	info, err := node.Info(ctx, "server").Result()
	if err != nil {
		return "", err
	}
	for line := range strings.SplitSeq(info, "\n") {
		if id, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok && id != "" {
			return id, nil
		}
	}
	return "", fmt.Errorf("redlock: no run_id in the server's INFO")
}

// addrOf names node by the address it dials, for errors.
func addrOf(node goredis.UniversalClient) string {
	if c, ok := node.(*goredis.Client); ok {
		return c.Options().Addr
	}
	return fmt.Sprintf("%T", node)
}
