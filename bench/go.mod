module github.com/sluice-io/sluice/bench

go 1.26.8

replace github.com/sluice-io/sluice => ../

require (
	github.com/sluice-io/sluice v0.0.0-00010101000000-000000000000
	golang.org/x/time v0.16.0
)

require github.com/puzpuzpuz/xsync/v4 v4.5.0 // indirect
