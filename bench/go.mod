module github.com/sluice-io/sluice/bench

go 1.26

replace github.com/sluice-io/sluice => ../
