package main

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// family is a warden subject against one peer library, over every setting
// the peer was measured at: its documented one and, where it has a retry
// pause, the tuned one.
type family struct {
	warden, peer string // the peer at its documented settings
	pairs        []pair
	target       float64
}

// families groups the pairs measured in scenario by warden subject and peer
// library, in the order of pairs.
func (b *bench) families(scenario string) []family {
	var out []family
	for _, p := range b.selected(scenario) {
		base := p.peer
		if of := b.subj[p.peer].tunedOf; of != "" {
			base = of
		}
		i := slices.IndexFunc(out, func(f family) bool { return f.warden == p.warden && f.peer == base })
		if i < 0 {
			out = append(out, family{warden: p.warden, peer: base, target: p.target})
			i = len(out) - 1
		}
		out[i].pairs = append(out[i].pairs, p)
	}
	return out
}

// allFamilies lists, once each, the families of the cycle scenarios: the
// fair-mode pairs are measured under contention only.
func (b *bench) allFamilies() []family {
	out := b.families("contended")
	for _, f := range b.families("uncontended") {
		if !slices.ContainsFunc(out, func(g family) bool { return g.warden == f.warden && g.peer == f.peer }) {
			out = append(out, f)
		}
	}
	return out
}

func (b *bench) familyLabel(f family) string {
	return b.subj[f.warden].label + " vs " + b.subj[f.peer].label
}

// counted is the ratio of a family that counts in one measurement: the
// worse of warden's throughput ratios against the peer's settings, and the
// setting that gave it.
type counted struct {
	ratio   float64
	setting string
}

func (b *bench) counted(f family, scenario string, n int, hold time.Duration) counted {
	c := counted{ratio: math.NaN()}
	for _, p := range f.pairs {
		r := ratio(b.cycleMedian(cycleKey{scenario, n, hold, p.warden}).ops, b.cycleMedian(cycleKey{scenario, n, hold, p.peer}).ops)
		if math.IsNaN(r) {
			continue
		}
		if math.IsNaN(c.ratio) || r < c.ratio {
			c.ratio = r
			c.setting = "documented"
			if b.subj[p.peer].tunedOf != "" {
				c.setting = "tuned"
			}
		}
	}
	return c
}

// column is one throughput measurement of the summary.
type column struct {
	title    string
	scenario string
	n        int
	hold     time.Duration
}

func (b *bench) columns() []column {
	var cols []column
	if b.ran("uncontended") {
		cols = append(cols, column{"1 worker", "uncontended", 1, 0})
	}
	if b.ran("contended") {
		for _, n := range b.s.contenders {
			for _, hold := range b.s.holds {
				cols = append(cols, column{fmt.Sprintf("%d workers, hold %v", n, hold), "contended", n, hold})
			}
		}
	}
	return cols
}

// countedSection writes the summary: for each warden subject and peer, the
// worse throughput ratio in each measurement, against the target.
func (b *bench) countedSection(w func(string, ...any)) {
	cols := b.columns()
	if len(cols) == 0 {
		return
	}
	w("## The ratios that count\n\n")
	w("warden's throughput ÷ the peer's, in every measurement: against a peer with a retry pause, the worse of the ratios against its documented settings and against it tuned (a 1ms pause), whichever flatters warden less; the setting that gave it is named. ")
	w("✓ marks a ratio at or above the target (1.0, or 0.95 against the raw Redis floor and 0.9 against the raw PostgreSQL lock, which do less than a lock with fencing tokens must); ✗ one below it.\n\n")
	w("| warden vs peer |")
	for _, c := range cols {
		w(" %s ↑ |", c.title)
	}
	w("\n|---|")
	for range cols {
		w("---|")
	}
	w("\n")
	for _, f := range b.allFamilies() {
		w("| %s (target %.2g×) |", b.familyLabel(f), f.target)
		for _, c := range cols {
			w(" %s |", b.countedCell(f, c))
		}
		w("\n")
	}
	w("\n")
}

func (b *bench) countedCell(f family, c column) string {
	if f.pairs[0].contendedOnly && c.scenario != "contended" {
		return "—"
	}
	r := b.counted(f, c.scenario, c.n, c.hold)
	if math.IsNaN(r.ratio) {
		return "—"
	}
	mark := "✗"
	if r.ratio >= f.target {
		mark = "✓"
	}
	s := fmtRatio(r.ratio) + " " + mark
	if len(f.pairs) > 1 {
		s += " (" + r.setting + ")"
	}
	return s
}

// tablesSection writes the PostgreSQL lock tables' state at each phase.
func (b *bench) tablesSection(w func(string, ...any)) {
	if len(b.tables) == 0 {
		return
	}
	w("## PostgreSQL lock tables\n\n")
	w("Each lock table as the server's statistics (pg_stat_user_tables) saw it: before the run aged it, after each subject served %d lock cycles over %d keys from %d workers, once vacuumed (the state its figures were measured in: the aging packs hours of churn into minutes, faster than autovacuum's rounds follow), and at the end of the run. ", b.s.churn, agingWorkers*agingKeys, agingWorkers)
	w("Dead rows are row versions a vacuum has yet to reclaim, which every statement on the table steps over; a HOT update writes no index entry. The statistics are the server's estimates, gathered as connections report them.\n\n")
	w("| phase | table | live rows | dead rows | row updates (HOT) | vacuums | heap | indexes |\n|---|---|---|---|---|---|---|---|\n")
	for _, t := range b.tables {
		hot := "—"
		if t.updates > 0 {
			hot = percent(float64(t.hot) / float64(t.updates))
		}
		w("| %s | %s | %d | %d | %d (%s) | %d | %s | %s |\n", t.phase, t.table, t.live, t.dead, t.updates, hot, t.vacuums, fmtBytes(float64(t.heap)), fmtBytes(float64(t.index)))
	}
	w("\n")
}
