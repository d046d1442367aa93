// A planted back-edge for layers.CatchesBackEdges: the "higher layer" of the probe pair defines a
// polymorphic class (vtable, typeinfo) and a function-local static.
namespace lfce { namespace autotune { struct Probe { virtual ~Probe(); virtual int f(); }; Probe::~Probe() {} int Probe::f() { static int calls = 0; return ++calls; } } }
