package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// chartData is a grouped bar chart: one row per pair, one bar per series.
// Every value is oriented so that above 1 favours warden.
type chartData struct {
	series []string
	rows   []chartRow
}

type chartRow struct {
	label  string
	values []float64 // by series; NaN: no bar
}

// chartData gathers the ratios that count, a row per warden subject and
// peer library: throughputs as warden ÷ peer, the worse over the peer's
// settings; costs (latency, round trips, memory) as peer ÷ warden, so that
// every bar reads "times better for warden".
func (b *bench) chartData() chartData {
	var d chartData
	type metric struct {
		name string
		get  func(f family) float64
	}
	var metrics []metric
	for _, c := range b.columns() {
		metrics = append(metrics, metric{c.title + ": acquisitions/s (w/p, worse setting)", func(f family) float64 {
			if f.pairs[0].contendedOnly && c.scenario != "contended" {
				return math.NaN()
			}
			return b.counted(f, c.scenario, c.n, c.hold).ratio
		}})
	}
	if b.ran("renewal") && len(b.selected("renewal")) > 0 {
		n := b.s.sizes[len(b.s.sizes)-1]
		renewal := func(f family) (w, p renewResult) {
			w, _ = b.renewMedian(n, f.warden)
			p, _ = b.renewMedian(n, f.peer)
			return w, p
		}
		metrics = append(metrics,
			// Round trips, not server commands: every Redis subject runs
			// the same commands per lock, and differs in how it sends them.
			metric{fmt.Sprintf("%d locks: round trips/period (p/w)", n), func(f family) float64 {
				w, p := renewal(f)
				return ratio(p.trips, w.trips)
			}},
			metric{fmt.Sprintf("%d locks: heap+stacks/lock (p/w)", n), func(f family) float64 {
				w, p := renewal(f)
				return ratio(p.heap+p.stack, w.heap+w.stack)
			}})
	}
	for _, m := range metrics {
		d.series = append(d.series, m.name)
	}
	for _, f := range b.allFamilies() {
		row := chartRow{label: b.familyLabel(f)}
		for _, m := range metrics {
			v := m.get(f)
			if v <= 0 || math.IsInf(v, 0) {
				v = math.NaN()
			}
			row.values = append(row.values, v)
		}
		d.rows = append(d.rows, row)
	}
	return d
}

var palette = []color.RGBA{
	{0x1f, 0x77, 0xb4, 0xff},
	{0xff, 0x7f, 0x0e, 0xff},
	{0x2c, 0xa0, 0x2c, 0xff},
	{0xd6, 0x27, 0x28, 0xff},
	{0x94, 0x67, 0xbd, 0xff},
	{0x8c, 0x56, 0x4b, 0xff},
	{0xe3, 0x77, 0xc2, 0xff},
	{0x7f, 0x7f, 0x7f, 0xff},
}

// writeChart draws d as horizontal bars on a log scale around 1.
func writeChart(path string, d chartData, title string) error {
	const (
		labelW  = 470 // the pair's name
		plotW   = 560
		rightW  = 60
		barH    = 9
		barGap  = 2
		rowGap  = 12
		top     = 56
		charW   = 7
		lineH   = 15
		padLeft = 10
	)
	series := max(1, len(d.series))
	rowH := series*(barH+barGap) + rowGap
	legendH := lineH*len(d.series) + 20
	width := padLeft + labelW + plotW + rightW
	height := top + len(d.rows)*rowH + 30 + legendH

	img := image.NewRGBA(image.Rect(0, 0, width, height))
	draw.Draw(img, img.Bounds(), image.NewUniform(color.White), image.Point{}, draw.Src)
	ink := color.RGBA{0x22, 0x22, 0x22, 0xff}
	grid := color.RGBA{0xdd, 0xdd, 0xdd, 0xff}
	text := func(x, y int, s string, c color.Color) {
		dr := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
		dr.DrawString(s)
	}
	rect := func(x0, y0, x1, y1 int, c color.Color) {
		if x1 < x0 {
			x0, x1 = x1, x0
		}
		draw.Draw(img, image.Rect(x0, y0, x1, y1), image.NewUniform(c), image.Point{}, draw.Src)
	}

	// The scale spans whole decades around every value, and at least
	// 0.1 to 10.
	lo, hi := -1.0, 1.0
	for _, r := range d.rows {
		for _, v := range r.values {
			if !math.IsNaN(v) {
				lo = math.Min(lo, math.Floor(math.Log10(v)))
				hi = math.Max(hi, math.Ceil(math.Log10(v)))
			}
		}
	}
	x0 := padLeft + labelW
	xOf := func(v float64) int {
		return x0 + int(math.Round((math.Log10(v)-lo)/(hi-lo)*float64(plotW)))
	}
	plotBottom := top + len(d.rows)*rowH

	text(padLeft, 18, title, ink)
	text(padLeft, 33, "bars: times in warden's favour, log scale; 1 = even (w/p: warden / peer, p/w: peer / warden)", ink)
	for e := lo; e <= hi; e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if math.Log10(v) > hi+1e-9 {
				continue
			}
			x := xOf(v)
			rect(x, top-4, x+1, plotBottom, grid)
			if m == 1 {
				label := formatTick(v)
				text(x-len(label)*charW/2, plotBottom+14, label, ink)
			}
		}
	}
	one := xOf(1)
	rect(one-1, top-4, one+1, plotBottom, ink)

	for i, r := range d.rows {
		y := top + i*rowH
		label := asciiOnly(r.label)
		if limit := labelW / charW; len(label) > limit {
			label = label[:limit-1] + "~"
		}
		text(padLeft, y+(series*(barH+barGap))/2+5, label, ink)
		for j, v := range r.values {
			by := y + j*(barH+barGap)
			if math.IsNaN(v) {
				continue
			}
			c := palette[j%len(palette)]
			x := xOf(v)
			if x == one {
				x = one + 1
			}
			rect(one, by, x, by+barH, c)
			s := fmt.Sprintf("%.2gx", v)
			if v >= 10 {
				s = fmt.Sprintf("%.0fx", v)
			}
			if v >= 1 {
				text(x+3, by+barH, s, ink)
			} else {
				text(x-3-len(s)*charW, by+barH, s, ink)
			}
		}
		if i > 0 {
			rect(padLeft, y-rowGap/2, width-padLeft, y-rowGap/2+1, grid)
		}
	}

	ly := plotBottom + 30
	for j, s := range d.series {
		c := palette[j%len(palette)]
		rect(padLeft, ly+j*lineH, padLeft+20, ly+j*lineH+barH, c)
		text(padLeft+28, ly+j*lineH+barH, s, ink)
	}

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func formatTick(v float64) string {
	if v >= 1 {
		return fmt.Sprintf("%.0fx", v)
	}
	return fmt.Sprintf("%gx", v)
}

// asciiOnly replaces what the bitmap font cannot draw.
func asciiOnly(s string) string {
	out := make([]rune, 0, len(s))
	for _, r := range s {
		switch {
		case r == '…':
			out = append(out, '.', '.', '.')
		case r < 0x20 || r > 0x7e:
			out = append(out, '?')
		default:
			out = append(out, r)
		}
	}
	return string(out)
}
