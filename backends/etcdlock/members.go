package etcdlock

import (
	"context"
	"errors"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/warden-go/warden/guard/driver"
)

// How long a request may go unanswered before the member it went to is
// probed, and how long that member then has to answer the probe. A member
// answers the probe (a Status, served locally) within milliseconds, even
// during an election, unless its process or its connection is frozen.
// A probe that fails only moves later requests to another member, so these
// are short: they decide how soon contenders stop sending to a frozen
// member.
const (
	probeAfter   = 250 * time.Millisecond
	probeTimeout = 500 * time.Millisecond
)

// members routes the Locker's requests to one etcd member at a time, over a
// connection of the Locker's own to each member it has used.
//
// The client balances its requests round robin over every member's
// connection, and a member whose process is frozen (stopped, swapped out, a
// stalled disk) keeps its connection open and answers nothing: with
// clientv3's default options (no gRPC keepalive), that connection stays in
// the rotation until the operating system gives up on it, and a third of
// every grant, put, release and keepalive stream waits for its timeout
// meanwhile. The client cannot be told to skip one member, so the Locker
// dials each endpoint on its own (client.Dial: the client's credentials,
// dial options and interceptors) and sends everything to one of them, the
// pinned member; when a request there goes unanswered for probeAfter, the
// pinned member is probed, and if it does not answer within probeTimeout
// (or knows no leader) the next endpoint is pinned instead. Requests already
// sent to the member that failed its probe are cut short (errAvoided), and
// streams (the session's keepalive, watches) move to the new member at once.
//
// The requests in flight are kept in one list, oldest first, watched by
// one timer (the watchdog) armed for the earliest moment one of them is due
// to be probed or cut short at its bound: a request costs one cancellable
// context and no timer of its own, where a timer and a context per bound,
// per attempt and per probe cost an uncontended cycle five timers and eight
// contexts. Requests answered in time leave the watchdog to fire for
// nothing, at most every probeAfter while requests keep coming.
//
// A client whose KV or Watcher was replaced (namespace.NewKV, a mock) is
// used as it is, since requests on connections of the Locker's own would
// bypass the replacement: all requests then go through the client, balanced
// as it does, with no steering.
type members struct {
	client *clientv3.Client
	steer  bool

	mu     sync.Mutex
	byEP   map[string]*member
	pinned *member
	// changed is closed, and replaced, when another member is pinned.
	changed chan struct{}
	closed  bool
	probes  sync.WaitGroup
	// unhook stops closing the connections with the client's.
	unhook func() bool
	// oldest and newest end the list of the requests in flight.
	oldest, newest *request
	// watchdog probes the members of requests unanswered for probeAfter
	// and cuts requests short at their bounds; armedAt is when it fires
	// next, zero when it is not armed.
	watchdog *time.Timer
	armedAt  time.Time
}

// request is one request in flight, in members' list.
type request struct {
	m      *member
	cancel context.CancelCauseFunc
	// probeAt is when its member is probed, unless answered by then or
	// probed already; cutAt is its bound.
	probeAt, cutAt time.Time
	probed         bool
	prev, next     *request
}

// member is one endpoint's connection, or the client itself when the
// Locker does not steer.
type member struct {
	ep      string
	conn    *grpc.ClientConn // owned only when ep != ""
	client  *clientv3.Client // its requests go through this one
	probing atomic.Bool
}

// errAvoided ends a request cut short because its member was found not
// answering: it would get no answer in time either.
var errAvoided = errors.New("etcd: the member stopped answering")

// movesOn reports whether a call that failed with err, having moved moved
// times already, starts over: when its request was cut short because its
// member stopped answering (errAvoided), or failed with one of also, at
// most twice, and not once ctx is done. The pin has moved by then, so the
// call starts over on another member, and two moves reach a third: with
// one member down, the call fails only when the others fail it too.
func movesOn(ctx context.Context, err error, moved int, also ...error) bool {
	if moved >= 2 || ctx.Err() != nil {
		return false
	}
	if errors.Is(err, errAvoided) {
		return true
	}
	for _, e := range also {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// errNoAnswer ends a request cut short at its bound.
var errNoAnswer = errors.New("etcd: no answer in time")

func newMembers(client *clientv3.Client) *members {
	// The types a client has unless its user replaced them.
	stockKV := reflect.TypeOf(clientv3.NewKVFromKVClient(nil, nil))
	stockWatcher := reflect.TypeOf(clientv3.NewWatchFromWatchClient(nil, nil))
	ms := &members{
		client:  client,
		steer:   reflect.TypeOf(client.KV) == stockKV && reflect.TypeOf(client.Watcher) == stockWatcher,
		byEP:    make(map[string]*member),
		changed: make(chan struct{}),
	}
	// The Locker's connections are the client's as far as its user can
	// tell: closing the client (a process shutting down, a test playing a
	// crash) must cut them too, or the sessions would live on.
	ms.mu.Lock()
	ms.unhook = context.AfterFunc(client.Ctx(), ms.close)
	ms.mu.Unlock()
	return ms
}

// pick returns the pinned member. The first call pins an endpoint at
// random, so that the processes sharing a cluster spread their load over its
// members as the client's balancing would.
func (ms *members) pick() *member {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return ms.pickLocked()
}

func (ms *members) pickLocked() *member {
	if ms.pinned == nil {
		ms.pinned = ms.member(rand.IntN(max(len(ms.client.Endpoints()), 1)))
	}
	return ms.pinned
}

// member returns the member of the i-th of the client's endpoints (wrapped
// around), dialing it on first use; the client itself when the Locker does
// not steer or the endpoint cannot be dialed. ms.mu is held.
func (ms *members) member(i int) *member {
	eps := ms.client.Endpoints()
	itself := &member{client: ms.client, conn: ms.client.ActiveConnection()}
	if !ms.steer || len(eps) == 0 || ms.closed {
		return itself
	}
	ep := eps[i%len(eps)]
	if m := ms.byEP[ep]; m != nil {
		return m
	}
	conn, err := ms.client.Dial(ep)
	if err != nil {
		return itself
	}
	c := clientv3.NewCtxClient(context.Background(), clientv3.WithZapLogger(ms.client.GetLogger()))
	c.KV = clientv3.NewKVFromKVClient(pb.NewKVClient(conn), ms.client)
	c.Watcher = clientv3.NewWatchFromWatchClient(pb.NewWatchClient(conn), ms.client)
	c.Lease = clientv3.NewLeaseFromLeaseClient(pb.NewLeaseClient(conn), ms.client, 0)
	m := &member{ep: ep, conn: conn, client: c}
	ms.byEP[ep] = m
	return m
}

// send sends one request, f, to the pinned member, on a context that is
// ctx's, cut short with cause errNoAnswer at cutAt, and with cause
// errAvoided if the Locker moves away from the member meanwhile. It returns
// f's error and, if the request was cut short, why. The member is probed
// when the request goes unanswered for probeAfter, or fails as a member
// that cannot be reached does: a killed member's connection refuses every
// request at once, and would otherwise keep the Locker's requests failing
// until it is back.
func (ms *members) send(ctx context.Context, cutAt time.Time, f func(context.Context, *clientv3.Client) error) (cut, err error) {
	rctx, cancel := context.WithCancelCause(ctx)
	r := &request{cancel: cancel, cutAt: cutAt}
	now := time.Now()
	r.probeAt = now.Add(probeAfter)
	ms.mu.Lock()
	r.m = ms.pickLocked()
	r.prev = ms.newest
	if ms.newest != nil {
		ms.newest.next = r
	} else {
		ms.oldest = r
	}
	ms.newest = r
	if due := earlier(r.probeAt, r.cutAt); ms.armedAt.IsZero() || due.Before(ms.armedAt) {
		ms.arm(now, due)
	}
	ms.mu.Unlock()

	err = f(rctx, r.m.client)

	ms.mu.Lock()
	if r.prev != nil {
		r.prev.next = r.next
	} else {
		ms.oldest = r.next
	}
	if r.next != nil {
		r.next.prev = r.prev
	} else {
		ms.newest = r.prev
	}
	ms.mu.Unlock()
	if err != nil {
		if c := context.Cause(rctx); c == errAvoided || c == errNoAnswer {
			cut = c
		}
	}
	cancel(nil)
	if unreachable(err) {
		ms.probe(r.m)
	}
	return cut, err
}

// arm has the watchdog fire at due. ms.mu is held.
func (ms *members) arm(now, due time.Time) {
	ms.armedAt = due
	if ms.watchdog == nil {
		ms.watchdog = time.AfterFunc(due.Sub(now), ms.watch)
	} else {
		ms.watchdog.Reset(due.Sub(now))
	}
}

// watch is the watchdog: it probes the members of the requests unanswered
// for probeAfter, once per request, cuts short the requests past their
// bounds, and arms itself for the next such moment, if any request is in
// flight.
func (ms *members) watch() {
	var (
		probe []*member
		cut   []*request
		next  time.Time
	)
	ms.mu.Lock()
	now := time.Now()
	for r := ms.oldest; r != nil; r = r.next {
		if !r.probed && !now.Before(r.probeAt) {
			r.probed = true
			probe = append(probe, r.m)
		}
		if !now.Before(r.cutAt) {
			cut = append(cut, r)
			continue
		}
		due := r.cutAt
		if !r.probed {
			due = earlier(due, r.probeAt)
		}
		if next.IsZero() || due.Before(next) {
			next = due
		}
	}
	ms.armedAt = time.Time{}
	if !next.IsZero() {
		ms.arm(now, next)
	}
	ms.mu.Unlock()
	for _, r := range cut {
		r.cancel(errNoAnswer)
	}
	for _, m := range probe {
		ms.probe(m)
	}
}

// earlier is the earlier of a and b.
func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// do sends one request, f, bounded by b and ctx (by b alone if detached:
// a write that must not be abandoned half way because the caller gave up
// keeps ctx's values only), and reports its failure as b.report does.
func (ms *members) do(ctx context.Context, b bound, detached bool, f func(context.Context, *clientv3.Client) error) error {
	cut, err := ms.send(b.parent(ctx, detached), time.Now().Add(time.Duration(b)), f)
	return b.report(ctx, cut, err)
}

// attemptTimeout bounds each attempt of a request that repeat may send
// again. A request sent while the cluster elects a leader can be lost with
// its proposal (forwarded to a leader that is gone) and would then hold
// all of its time: an election is over in a second or two, and the next
// attempt lands then.
const attemptTimeout = time.Second

// repeat sends an idempotent request, f, until it is answered, ctx ends
// (unless detached, as in do) or b has passed: in attempts of
// attemptTimeout at most, again after an attempt that timed out or could
// not reach a member, each time on the member pinned then. It reports the
// last attempt's error as b.report does. Any other error (one the server
// answered, a closed client) ends it.
func (ms *members) repeat(ctx context.Context, b bound, detached bool, f func(context.Context, *clientv3.Client) error) error {
	parent := b.parent(ctx, detached)
	end := time.Now().Add(time.Duration(b))
	pause := driver.Backoff{Min: 20 * time.Millisecond, Max: 250 * time.Millisecond}
	for {
		cut, err := ms.send(parent, earlier(end, time.Now().Add(attemptTimeout)), f)
		if err == nil || parent.Err() != nil || !(cut != nil || unreachable(err)) {
			return b.report(ctx, cut, err)
		}
		left := time.Until(end)
		if left <= 0 || driver.Sleep(parent, min(pause.Next(), left), nil) != nil || !time.Now().Before(end) {
			if parent.Err() == nil {
				cut = errNoAnswer
			}
			return b.report(ctx, cut, err)
		}
	}
}

// unreachable reports whether err is the failure of a request that could
// not reach its member, or that the member could not serve (it knows no
// leader).
func unreachable(err error) bool { return code(err) == codes.Unavailable }

// refused reports whether err is a refusal of a request, which was
// therefore not applied: the member's answer refusing it (want of rights,
// codes.PermissionDenied; a request etcd finds invalid or too large; a
// lease it does not know; a revision out of range), or the client's
// refusal to send it at all (see unsent). An answer too large for the
// client to receive (codes.ResourceExhausted too) is not among them: the
// server may have applied the request whose answer that was.
func refused(err error) bool {
	switch code(err) {
	case codes.PermissionDenied, codes.InvalidArgument, codes.NotFound, codes.OutOfRange:
		return true
	case codes.ResourceExhausted:
		return unsent(err)
	}
	return false
}

// unsent reports whether err is gRPC's refusal to send a request larger
// than the client's send limit (clientv3.Config.MaxCallSendMsgSize, 2 MiB
// by default): a lock name of a few hundred KiB makes one, since a put
// carries the lock's directory three times. That refusal, made before
// anything is sent, carries nothing to tell it apart but its text, which
// lacks the "grpc: " that starts the server's own refusal to send an
// answer too large (a request it did apply). Should gRPC reword it, such
// a request counts as one whose outcome is unknown again: its session is
// given up, which loses locks but never holds one twice.
func unsent(err error) bool {
	var se interface{ GRPCStatus() *status.Status }
	return errors.As(err, &se) && se.GRPCStatus().Code() == codes.ResourceExhausted &&
		strings.HasPrefix(se.GRPCStatus().Message(), "trying to send message larger than max")
}

// refusedAgain reports whether err is a refusal that a new attempt at the
// same acquisition would meet again: want of rights, or a request too
// large for the member or for the client to send (the lock's name is too
// long).
func refusedAgain(err error) bool {
	return denied(err) || unsent(err) || errors.Is(err, rpctypes.ErrRequestTooLarge)
}

// denied reports whether err is a refusal for want of rights. A watch
// refused so carries the refusal as text alone: clientv3 makes an error of
// the reason the server gave, the refusal's text in full.
func denied(err error) bool {
	return code(err) == codes.PermissionDenied || err != nil && err.Error() == rpctypes.ErrGRPCPermissionDenied.Error()
}

// code is the gRPC code err carries, as an etcd error or as a status;
// codes.Unknown when it carries neither, codes.OK for nil.
func code(err error) codes.Code {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code()
	}
	if s, ok := status.FromError(err); ok {
		return s.Code()
	}
	return codes.Unknown
}

// changes returns a channel closed when another member is pinned.
func (ms *members) changes() <-chan struct{} {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return ms.changed
}

// probe checks, once at a time per member, that m answers at all, and pins
// the next endpoint when it does not.
func (ms *members) probe(m *member) {
	if m.ep == "" || !m.probing.CompareAndSwap(false, true) {
		return
	}
	ms.mu.Lock()
	if ms.closed {
		ms.mu.Unlock()
		m.probing.Store(false)
		return
	}
	ms.probes.Add(1)
	ms.mu.Unlock()
	go func() {
		defer ms.probes.Done()
		defer m.probing.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		defer cancel()
		resp, err := pb.NewMaintenanceClient(m.conn).Status(ctx, &pb.StatusRequest{})
		if err == nil && resp.Leader != 0 {
			return
		}
		ms.avoid(m)
	}()
}

// avoid pins another endpoint than m's, if m is still the pinned member:
// the first after it, in the client's order, whose connection is not known
// to be failing. During an election every member knows no leader, and the
// pin moves from one to the next; it must not move to the member that was
// killed, whose connection refuses, or waits for, every request until it is
// back.
func (ms *members) avoid(m *member) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.closed || len(ms.client.Endpoints()) < 2 {
		// With one member, its requests have nowhere else to go, and
		// cutting them short would only fail them early: a put cut short
		// gives up its session, and every lock on it. A member that is
		// slow, as one under load is, answers them within their bounds;
		// one that is gone fails them at their bounds.
		return
	}
	// Whatever was sent to m waits for nothing.
	for r := ms.oldest; r != nil; r = r.next {
		if r.m == m {
			r.cancel(errAvoided)
		}
	}
	if ms.pinned != m {
		return
	}
	eps := ms.client.Endpoints()
	i := slices.Index(eps, m.ep)
	var next *member
	for j := 1; j <= len(eps); j++ {
		c := ms.member(i + j)
		if next == nil || health(c) < health(next) {
			next = c
		}
	}
	if next == nil {
		return
	}
	if health(next) == failing {
		// Every connection fails: try the chosen one now rather than at
		// the end of its reconnection backoff, which grows to minutes.
		next.conn.ResetConnectBackoff()
	}
	ms.pinned = next
	close(ms.changed)
	ms.changed = make(chan struct{})
}

// How usable a member's connection looks, best first.
const (
	usable = iota
	connecting
	failing
)

// health is how usable m's connection looks: a connection not yet used is
// as good as a ready one.
func health(m *member) int {
	switch m.conn.GetState() {
	case connectivity.Idle, connectivity.Ready:
		return usable
	case connectivity.Connecting:
		return connecting
	default:
		return failing
	}
}

// close closes the connections the Locker dialed, once nothing of the
// Locker sends on them any more.
func (ms *members) close() {
	ms.mu.Lock()
	ms.closed = true
	byEP, unhook := ms.byEP, ms.unhook
	ms.byEP = nil
	ms.mu.Unlock()
	unhook()
	ms.probes.Wait()
	for _, m := range byEP {
		m.client.Close()
		m.conn.Close()
	}
}
