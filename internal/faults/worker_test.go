//go:build faults

package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"time"

	"github.com/warden-go/warden/guard"
)

// workerEnv carries a worker's spec, as JSON, to the test binary run again
// as a worker process.
const workerEnv = "WARDEN_FAULTS_WORKER"

// workerSpec is what one worker process is told.
type workerSpec struct {
	ID             int           `json:"id"`
	Store          string        `json:"store"`
	Backend        backendSpec   `json:"backend"`
	Prefix         string        `json:"prefix"`
	TTL            time.Duration `json:"ttl"`
	ReleaseTimeout time.Duration `json:"release_timeout"`
}

// thinkTime is the mean pause of a worker between two sections.
const thinkTime = 10 * time.Millisecond

var errRefused = errors.New("the fenced store refused the write")

// runWorker is the worker process: it loops on Do over lockKey, running the
// fenced-counter section, until its stdin closes, then releases everything
// and exits 0. Any other exit status is a failure the test reports.
func runWorker(raw string) int {
	var ws workerSpec
	if err := json.Unmarshal([]byte(raw), &ws); err != nil {
		fmt.Fprintf(os.Stderr, "worker: bad spec: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("worker", ws.ID)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	// The parent closing our stdin is the order to stop; a parent that dies
	// closes it too, so no worker outlives its test.
	go func() {
		io.Copy(io.Discard, os.Stdin)
		stop()
	}()

	locker, opts, closeBackend, err := openLocker(ws.Backend, ws.TTL)
	if err != nil {
		log.Error("backend", "error", err)
		return 2
	}
	defer closeBackend()
	g, err := guard.New(locker, guard.WithTTL(ws.TTL), guard.WithPrefix(ws.Prefix),
		guard.WithReleaseTimeout(ws.ReleaseTimeout), guard.WithLogger(log))
	if err != nil {
		log.Error("guard", "error", err)
		return 2
	}
	st, err := dialStore(ws.Store)
	if err != nil {
		log.Error("store", "error", err)
		return 2
	}

	for sec := 1; ctx.Err() == nil; sec++ {
		var (
			lctx    context.Context
			token   uint64
			entered time.Time
			lostAt  time.Time
			stErr   error
		)
		err := g.Do(ctx, lockKey, func(c context.Context, l *guard.Lock) error {
			entered = time.Now()
			lctx, token = c, l.Token()
			base := request{Worker: ws.ID, Section: sec, Token: token, Entered: entered}
			r := base
			r.Op = "read"
			rep, err := st.call(r)
			if err != nil {
				stErr = err
				return err
			}
			hold := rep.Hold
			// Two increments per section, both with the section's token: the
			// second comes after the section lingered, which is where the
			// faults hit it.
			for i := int64(1); i <= 2; i++ {
				w := base
				w.Op, w.Value = "write", rep.Value+i
				wr, err := st.call(w)
				if err != nil {
					stErr = err
					return err
				}
				if !wr.Accepted {
					return fmt.Errorf("%w: %s", errRefused, wr.Reason)
				}
				if i == 2 {
					break
				}
				// A careless section: it stops lingering when its context
				// ends, but writes anyway, so that only the fence stands
				// between a holder that lost its lock and the counter. A
				// paused holder could not have looked in any case.
				t := time.NewTimer(hold)
				select {
				case <-t.C:
				case <-c.Done():
					t.Stop()
					if errors.Is(context.Cause(c), guard.ErrLockLost) {
						lostAt = time.Now()
					}
				}
			}
			return nil
		}, opts...)
		if stErr != nil {
			log.Error("store", "error", stErr)
			return 3
		}
		if lctx == nil {
			if ctx.Err() != nil {
				break
			}
			// Waiting Do only returns at the end of ctx; anything else is
			// worth seeing in the worker's log, and not worth a busy loop.
			log.Warn("not acquired", "error", err)
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		end := request{Op: "end", Worker: ws.ID, Section: sec, Token: token, Entered: entered,
			DoLost: errors.Is(err, guard.ErrLockLost), CauseLost: errors.Is(context.Cause(lctx), guard.ErrLockLost), LostAt: lostAt}
		if err != nil {
			end.DoErr = err.Error()
		}
		if _, err := st.call(end); err != nil {
			log.Error("store", "error", err)
			return 3
		}
		// A pause between sections, as real work between jobs would make:
		// without it the releasing worker takes the lock straight back, and
		// polling waiters (sqllock, RedLock) starve, which is how those
		// locks are documented to behave but says nothing about faults.
		select {
		case <-ctx.Done():
		case <-time.After(rand.N(2 * thinkTime)):
		}
	}
	return 0
}
