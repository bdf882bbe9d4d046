package lua

// Project Redis API: the cache (docs/project-redis-api.md). Every script touches
// only the keys of one project, which share the hash tag
// {<env>:<project_id>}.
var (
	ProjectCachePut    = mustLoad("project/cache_put")
	ProjectCacheDelete = mustLoad("project/cache_delete")
	ProjectCachePrune  = mustLoad("project/cache_prune")
	ProjectCacheState  = mustLoad("project/cache_state")
	ProjectMetaSync    = mustLoad("project/meta_sync")
)
