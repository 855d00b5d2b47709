module github.com/fencegate/fencegate/clients/go

go 1.19
