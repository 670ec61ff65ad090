//go:build faults

package faults

import (
	"strings"
	"testing"
	"time"
)

// TestJudgesCatchViolations feeds the judges histories that break each rule
// (no servers, no processes), so that a green table means the rules were
// checked, not that they cannot fail.
func TestJudgesCatchViolations(t *testing.T) {
	// Each worker runs one section, which starts with its read.
	type op struct {
		op     string
		worker int
		token  uint64
		value  int64
	}
	const tick = 2 * time.Millisecond
	cases := []struct {
		name      string
		unfenced  bool // the store accepts every write
		fenceLost bool
		ops       []op
		want      []string // substrings of the failures
		overlaps  int
		ooo       int
	}{
		{
			name: "clean history",
			ops: []op{
				{"read", 0, 1, 0}, {"write", 0, 1, 1}, {"write", 0, 1, 2},
				{"read", 1, 2, 0}, {"write", 1, 2, 3}, {"write", 1, 2, 4},
			},
		},
		{
			// Two holders at once, the second entering before the first
			// wrote: even with increasing tokens, the sections overlap.
			name: "overlapping holders",
			ops: []op{
				{"read", 0, 1, 0}, {"read", 1, 2, 0}, {"write", 0, 1, 1}, {"write", 1, 2, 1},
			},
			want:     []string{"overlap", "increments were lost"},
			overlaps: 1,
		},
		{
			// The backend granted token 1 after token 2: the fence refuses
			// the late holder, and the judges still name the regression.
			name: "token regression",
			ops: []op{
				{"read", 0, 2, 0}, {"write", 0, 2, 1},
				{"read", 1, 1, 0}, {"write", 1, 1, 2},
			},
			want: []string{"grants whose token was not above"},
			ooo:  1,
		},
		{
			name:      "token regression after a documented loss of the fence",
			fenceLost: true,
			ops: []op{
				{"read", 0, 2, 0}, {"write", 0, 2, 1},
				{"read", 1, 1, 0}, {"write", 1, 1, 2},
			},
		},
		{
			// A store that fails to fence: the judges do not take its word.
			name:     "unfenced store",
			unfenced: true,
			ops: []op{
				{"read", 0, 2, 0}, {"write", 0, 2, 1},
				{"read", 1, 1, 1}, {"write", 1, 1, 2},
			},
			want: []string{"accepted write of worker 1", "grants whose token was not above"},
			ooo:  2,
		},
		{
			name: "duplicate token",
			ops: []op{
				{"read", 0, 3, 0}, {"write", 0, 3, 1},
				{"read", 1, 3, 1}, {"write", 1, 3, 2},
			},
			want: []string{"grants whose token was not above"},
			ooo:  1,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st, err := startStore(defaultHold)
			if err != nil {
				t.Fatal(err)
			}
			defer st.close()
			st.unfenced = c.unfenced
			entered := map[int]time.Time{}
			for _, o := range c.ops {
				if o.op == "read" {
					entered[o.worker] = time.Now()
				}
				st.apply(request{Op: o.op, Worker: o.worker, Section: 1, Token: o.token, Value: o.value, Entered: entered[o.worker]})
				// Apart by more than the clock's resolution, so that the
				// history's order is the order of its timestamps.
				time.Sleep(tick)
			}
			r := &run{t: t, sc: scenario{backend: "history", fault: c.name, fenceLost: c.fenceLost}, st: st, selfTest: true}
			r.judge()
			got := strings.Join(r.failures, "\n")
			for _, w := range c.want {
				if !strings.Contains(got, w) {
					t.Errorf("no failure mentioning %q; failures:\n%s", w, got)
				}
			}
			if len(c.want) == 0 && got != "" {
				t.Errorf("failures for a history that breaks no rule:\n%s", got)
			}
			if r.row.overlaps != c.overlaps || r.row.outOfOrder != c.ooo {
				t.Errorf("overlaps %d, tokens out of order %d; want %d, %d", r.row.overlaps, r.row.outOfOrder, c.overlaps, c.ooo)
			}
		})
	}
}
